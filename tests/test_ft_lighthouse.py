"""``sparse2d.ft.lighthouse``: an in-process torchft lighthouse and the reachability check."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from sparse2d.errors import FaultToleranceError
from sparse2d.ft.lighthouse import check_reachable, start_lighthouse
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
        "from sparse2d.ft.lighthouse import _server_class_without_torch, check_reachable, "
        "start_lighthouse\n"
        "server = start_lighthouse(1, server_class=_server_class_without_torch())\n"
        "check_reachable(server.address(), timeout_s=5)\n"
        "assert 'torch' not in sys.modules and 'torchft' not in sys.modules, 'torch imported'\n"
        "server.shutdown()\n"
        "from torchft.coordination import LighthouseServer\n"
        "assert LighthouseServer is type(server)\n"
        "assert _server_class_without_torch() is None  # torchft loaded: the regular import\n"
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
