"""``sparse2d.ft.lighthouse``: an in-process torchft lighthouse, the reachability check and
the job check (a group never registers with another job's lighthouse)."""

from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
import time

import pytest

from sparse2d.errors import ConfigError, FaultToleranceError
from sparse2d.ft.lighthouse import (
    JOB_ENV,
    check_job,
    check_reachable,
    checked_job,
    replica_id,
    start_lighthouse,
)
from tests.conftest import ROOT


def test_reachable_lighthouse_passes_the_check() -> None:
    server = start_lighthouse(min_replicas=1)
    try:
        check_reachable(server.address(), timeout_s=5)
    finally:
        server.shutdown()


def test_unreachable_lighthouse_fails_in_one_line_within_the_timeout() -> None:
    with socket.socket() as s:  # bound, never listening: refused, and nobody else takes it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        start = time.monotonic()
        _refused(port)
    assert time.monotonic() - start < 3


def _refused(port: int) -> None:
    with pytest.raises(
        FaultToleranceError, match=rf"lighthouse http://127.0.0.1:{port} unreachable within 1 s"
    ):
        check_reachable(f"http://127.0.0.1:{port}", timeout_s=1)


def test_the_lighthouse_process_serves_without_importing_torch() -> None:
    """``python -m sparse2d.ft.lighthouse`` (launch/ft_local.sh's) loads torchft's Rust server
    alone: a group can reach it, torch is never imported, and a later ``import torchft`` in
    the same process reuses the loaded extension."""
    code = (
        "import sys\n"
        "from sparse2d.ft.lighthouse import _rust_module_without_torch, check_reachable, "
        "start_lighthouse\n"
        "server = start_lighthouse(1, server_class=_rust_module_without_torch().LighthouseServer)\n"
        "check_reachable(server.address(), timeout_s=5)\n"
        "assert 'torch' not in sys.modules and 'torchft' not in sys.modules, 'torch imported'\n"
        "server.shutdown()\n"
        "from torchft.coordination import LighthouseServer\n"
        "assert LighthouseServer is type(server)\n"
        "assert _rust_module_without_torch() is None  # torchft loaded: the regular import\n"
        "print('ok')\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


def test_the_lighthouse_process_on_port_0_writes_the_port_it_bound(tmp_path) -> None:
    """``--port 0 --port-file F`` (``LIGHTHOUSE_PORT=0`` in launch/ft_local.sh): the kernel picks
    the port and the lighthouse binds it at once, so no other process can take it between a
    choice and the bind; the file holds that port, whole, once the lighthouse listens."""
    port_file = tmp_path / "lighthouse.port"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sparse2d.ft.lighthouse",
            "--port",
            "0",
            "--port-file",
            str(port_file),
        ],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        port = int(port_file.read_text())  # written before the line
        assert 0 < port < 65536 and line.rstrip().endswith(f":{port}"), (line, port)
        check_reachable(f"http://127.0.0.1:{port}", timeout_s=5)
        assert not (tmp_path / "lighthouse.port.tmp").exists()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode == 0


def _serve(tmp_path, *args: str) -> tuple[subprocess.Popen, str]:
    """``python -m sparse2d.ft.lighthouse --port 0`` with ``args``; (process, address)."""
    port_file = tmp_path / "lighthouse.port"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop(JOB_ENV, None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sparse2d.ft.lighthouse",
            "--port",
            "0",
            "--port-file",
            str(port_file),
            *args,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    proc.stdout.readline()  # type: ignore[union-attr]  # after the port file and the mark
    return proc, f"http://127.0.0.1:{int(port_file.read_text())}"


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=30)


def test_a_group_never_registers_with_another_jobs_lighthouse(tmp_path) -> None:
    """The launcher's lighthouse carries its job (``--job-id``): a group of that job passes,
    a group of another job, or of none, is refused in one line naming both and the fix."""
    proc, address = _serve(tmp_path, "--job-id", "job-a")
    try:
        check_job(address, "job-a", timeout_s=5)
        for job, mine in (("job-b", "job job-b"), (None, "no job")):
            with pytest.raises(FaultToleranceError, match=rf"serves job job-a, .* to {mine}"):
                check_job(address, job, timeout_s=5)
        env = dict(os.environ, PYTHONPATH=str(ROOT), **{JOB_ENV: "job-b"})
        run = subprocess.run(  # the launcher's check of a lighthouse it did not start
            [sys.executable, "-m", "sparse2d.ft.lighthouse", "--check", address],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 1, run.stderr
        assert f"export {JOB_ENV}=job-a" in run.stderr and len(run.stderr.splitlines()) == 1
    finally:
        _stop(proc)


def test_an_unmarked_lighthouse_with_another_jobs_groups_is_refused() -> None:
    """A lighthouse started without a job (torchft_lighthouse, an in-process one) serves any
    group, until the groups of a named job heartbeat there: then only that job's."""
    from torchft._torchft import LighthouseClient

    server = start_lighthouse(min_replicas=1)
    try:
        address = server.address()
        check_job(address, None, timeout_s=5)
        check_job(address, "job-b", timeout_s=5)
        LighthouseClient(address, datetime.timedelta(seconds=5)).heartbeat(replica_id(0, "job-a"))
        check_job(address, "job-a", timeout_s=5)
        with pytest.raises(FaultToleranceError, match="serves job job-a"):
            check_job(address, "job-b", timeout_s=5)
    finally:
        server.shutdown()


def test_a_taken_port_stops_the_lighthouse_in_one_line(tmp_path) -> None:
    """A fixed ``--port`` another lighthouse serves: exit 1 with one line naming the port and
    ``--port 0``; the job's groups never start against the other job's lighthouse."""
    proc, address = _serve(tmp_path)
    port = address.rsplit(":", 1)[1]
    try:
        run = subprocess.run(
            [sys.executable, "-m", "sparse2d.ft.lighthouse", "--port", port],
            cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            capture_output=True,
            text=True,
            timeout=60,
        )
        lines = [x for x in run.stderr.splitlines() if x.startswith("sparse2d.ft.lighthouse:")]
        assert run.returncode == 1 and len(lines) == 1, run.stderr
        assert f"cannot serve on port {port}" in lines[0] and "--port 0" in lines[0]
    finally:
        _stop(proc)


def test_a_malformed_job_name_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"SPARSE2D_FT_JOB='a b' must be letters"):
        checked_job("a b")
    assert replica_id(3, "ft-1-2") == "sparse2d_job_ft-1-2_group_3"


def _ft_local(tmp_path, **env: str) -> subprocess.CompletedProcess:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TORCHFT_LIGHTHOUSE", "LIGHTHOUSE_PORT", JOB_ENV)
    }
    return subprocess.run(
        ["launch/ft_local.sh", f"run_dir={tmp_path / 'run'}"],
        cwd=ROOT,
        timeout=120,
        env={**clean, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
    )


def test_the_launcher_stops_in_one_line_before_any_group_on_another_jobs_lighthouse(
    tmp_path,
) -> None:
    """launch/ft_local.sh given another job's lighthouse, by its fixed port (taken) or by
    ``TORCHFT_LIGHTHOUSE``: one line and exit 1, no group started."""
    proc, address = _serve(tmp_path, "--job-id", "job-a")
    port = address.rsplit(":", 1)[1]
    try:
        for env, said in (
            ({"LIGHTHOUSE_PORT": port}, f"the lighthouse did not start (LIGHTHOUSE_PORT={port})"),
            ({"TORCHFT_LIGHTHOUSE": address}, "serves job job-a, and this group belongs to no job"),
        ):
            run = _ft_local(tmp_path, **env)
            assert run.returncode == 1 and said in run.stderr, run.stderr
            assert len(run.stderr.strip().splitlines()) == 1 and run.stdout == "", run.stderr
            assert not (tmp_path / "run" / "replica_0").exists()
    finally:
        _stop(proc)


def _addresses() -> list[str]:
    """This machine's IPv4 addresses other than loopback (``hostname -I``)."""
    found = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    return [a for a in found if "." in a and not a.startswith("127.")]


def test_a_lighthouse_bound_to_one_address_is_not_reached_on_another(tmp_path) -> None:
    """``--host 127.0.0.1`` (launch/ft_local.sh's): torchft's lighthouse admits whoever reaches
    it, so it listens on loopback only; the job's mark is still on its status page (marked
    through the address served, not the host's name, which may resolve elsewhere)."""
    others = _addresses()
    if not others:
        pytest.skip("no address but loopback on this machine")
    proc, address = _serve(tmp_path, "--host", "127.0.0.1", "--job-id", "job-a")
    try:
        check_job(address, "job-a", timeout_s=5)
        with pytest.raises(FaultToleranceError, match="serves job job-a"):
            check_job(address, "job-b", timeout_s=5)
        port = int(address.rsplit(":", 1)[1])
        for other in others:
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection((other, port), timeout=5).close()
    finally:
        _stop(proc)


def test_a_strangers_heartbeat_does_not_turn_the_job_away_from_its_marked_lighthouse(
    tmp_path,
) -> None:
    """Another job's group heartbeats at a lighthouse marked for job-a (a stranger at the
    port): job-a's groups, a restarted one included, still pass the check; job-b's do not."""
    from torchft._torchft import LighthouseClient

    proc, address = _serve(tmp_path, "--job-id", "job-a")
    try:
        LighthouseClient(address, datetime.timedelta(seconds=5)).heartbeat(replica_id(0, "job-b"))
        check_job(address, "job-a", timeout_s=5)
        with pytest.raises(FaultToleranceError, match="serves job job-a"):
            check_job(address, "job-b", timeout_s=5)
    finally:
        _stop(proc)
