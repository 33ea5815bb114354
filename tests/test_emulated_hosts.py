"""``launch/emulated_hosts.sh``: several hosts on one machine, each a network namespace with
its own shaped link, one torchrun per host (real gloo over the hosts' interfaces).

Root only (namespaces, bridges, tc): CI runs as root; elsewhere these tests skip, saying why.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.reader_env import terminal_signals

ROOT = Path(__file__).resolve().parent.parent
LAUNCHER = ROOT / "launch" / "emulated_hosts.sh"
BASH = shutil.which("bash") or "/bin/bash"
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="emulated hosts need root (ip netns, bridges, tc); CI runs as root"
)
TINY = (
    "model.tables=[{name: t, count: 4, rows: 500, dim: 16}]",
    "data.batch_size_per_rank=64",
    "train.eval_batches=2",
    "train.log_every=10",
    "train.progress_bar=false",
)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    return {**env, "PYTHON": sys.executable, "HOSTS": "2", "NPROC": "2", **extra}


def _launch(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BASH, str(LAUNCHER), *args],
        cwd=ROOT,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=600,
    )


def _left_behind(run_id: str, marker: Path) -> list[str]:
    """Namespaces, links and per-namespace files of run ``run_id``, and processes whose
    command line names ``marker`` (every rank's names its run directory), still there."""
    left = [
        n
        for n in subprocess.run(
            ["ip", "netns", "list"], capture_output=True, text=True
        ).stdout.split()
        if run_id in n
    ]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    left += [line.split(":")[1].strip() for line in links.splitlines() if run_id in line]
    left += (
        [str(p) for p in Path("/etc/netns").glob(f"*{run_id}*")]
        if Path("/etc/netns").exists()
        else []
    )
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if str(marker) in cmdline and proc.name != str(os.getpid()):
                left.append(f"pid {proc.name}: {cmdline[:80]}")
    return left


def _cluster(run_dir: Path) -> dict:
    return json.loads((run_dir / "cluster.json").read_text())


def test_2d_equals_torchrec_1d_across_hosts(tmp_path: Path) -> None:
    """2 hosts x 2 ranks, EXACT_SGD, a sync after every step: DMPCollection (L=2, both replica
    layouts) equals TorchRec's 1D DMP within 1e-5 with bit-identical replicas, each host's
    ranks in their own namespace and all traffic between hosts over their shaped links."""
    out = tmp_path / "check.json"
    done = _launch(str(out), ENTRY="tests.cross_host_check", RUN_DIR=str(tmp_path), LINK="1gbit")
    report = json.loads(out.read_text()) if out.exists() else {}
    assert done.returncode == 0 and report.get("ok"), (report.get("error"), done.stderr[-3000:])
    cluster = _cluster(tmp_path)
    names = [h["namespace"] for h in cluster["hosts"]]
    assert report["hosts"] == [names[0], names[0], names[1], names[1]]  # 2 ranks on each host
    for layout in ("intra_host", "inter_host"):
        assert report[layout]["replicas"] == 2 and report[layout]["moved"] > 1e-3
    assert _left_behind(cluster["id"], tmp_path) == []


def test_inter_host_layout_sends_fewer_bytes_across_hosts_than_1d(tmp_path: Path) -> None:
    """Bytes that crossed the hosts' links per step (the interfaces' own counters): 2D with the
    sharding group inside a host and a sync every 5 steps moves less than 1D, whose lookup
    all-to-all crosses hosts every step; cluster.json names each host as documented."""
    summaries = {}
    for name, group in (("1d", 4), ("2d", 2)):
        run_dir = tmp_path / name
        done = _launch(
            "train.steps=20",
            *TINY,
            f"run_dir={run_dir}",
            f"parallel.sharding_group_size={group}",
            "parallel.replica_layout=inter_host",
            "parallel.sync.every=5",
            CONFIG="configs/tiny_cpu.yaml",
            LINK="1gbit",
        )
        assert done.returncode == 0, done.stderr[-3000:]
        summaries[name] = json.loads((run_dir / "summary.json").read_text())
        cluster = _cluster(run_dir)
        assert [sorted(h) for h in cluster["hosts"]] == [
            sorted(
                [
                    "host",
                    "namespace",
                    "address",
                    "interface",
                    "bridge_interface",
                    "launcher_pid",
                    "link",
                    "ranks",
                ]
            )
        ] * 2
        assert [h["link"] for h in cluster["hosts"]] == ["1gbit", "1gbit"]
        # what the advisor prices here: these hosts, twice each one's even share of the
        # cores (docs/training.md says why), each host's link in bytes/s
        topology = (run_dir / "topology.yaml").read_text()
        assert "ranks_per_host: 2\n" in topology and "host_link_bw: 125000000\n" in topology
        assert f"cores_per_host: {2 * (os.cpu_count() or 1) / 2}\n" in topology, topology
        assert _left_behind(cluster["id"], run_dir) == []
    one_d = summaries["1d"]["host_link_bytes_per_step"]
    two_d = summaries["2d"]["host_link_bytes_per_step"]
    assert summaries["2d"]["num_replicas"] == 2 and summaries["1d"]["num_replicas"] == 1
    assert 0 < two_d < one_d, (two_d, one_d)


@pytest.mark.parametrize(
    ("env", "args", "says"),
    [
        ({"LINK": "fast"}, (), "LINK=fast is not a rate"),
        ({"HOSTS": "two"}, (), "HOSTS=two must be a whole number"),
        ({"FT": "2"}, (), "FT=2 must be 0 or 1"),
        ({}, ("parallel.no_such_key=1",), "no_such_key"),
        ({"PYTHON": "/nonexistent/python"}, (), "run 'make install'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(env: dict, args: tuple, says: str) -> None:
    done = _launch(*args, **env)
    assert done.returncode == (1 if "PYTHON" in env else 2), (done.returncode, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0], done.stderr


def test_not_root_or_no_tc_is_one_line(tmp_path: Path) -> None:
    """Without root, or without tc on PATH: one line naming what is missing, exit 2. The
    unprivileged user runs a copy of the launcher in a folder it can read: the checkout may
    sit where only root can (a fresh clone under ``mktemp -d``, mode 700), and the refusal
    comes before the launcher reads anything else of the project."""
    shared = Path(tempfile.mkdtemp(prefix="sparse2d-nobody-"))
    try:
        shared.chmod(0o755)
        (shared / "launch").mkdir(mode=0o755)
        copy = shutil.copy(LAUNCHER, shared / "launch" / LAUNCHER.name)
        nobody = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "bash", str(copy)],
            cwd=shared,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        shutil.rmtree(shared)
    assert nobody.returncode == 2 and nobody.stderr.strip().count("\n") == 0, nobody.stderr
    assert "needs root" in nobody.stderr
    tools = tmp_path / "bin"  # every command on PATH but tc
    tools.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        for tool in Path(folder).glob("*") if Path(folder).is_dir() else ():
            if tool.name != "tc" and not (tools / tool.name).exists():
                (tools / tool.name).symlink_to(tool)
    no_tc = _launch(PATH=str(tools))
    assert no_tc.returncode == 2 and "'tc' not found" in no_tc.stderr, no_tc.stderr
    assert no_tc.stderr.strip().count("\n") == 0


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_tears_everything_down(tmp_path: Path, signum: int) -> None:
    """A signal while the hosts train: the launcher exits and leaves no namespace, link,
    per-namespace file or process behind."""
    run_dir = tmp_path / "run"
    job = subprocess.Popen(
        ["bash", str(LAUNCHER), "train.steps=100000", *TINY, f"run_dir={run_dir}"],
        cwd=ROOT,
        env=_env(CONFIG="configs/tiny_cpu.yaml", LINK="1gbit"),
        preexec_fn=terminal_signals,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        seen = ""
        for line in job.stdout:  # type: ignore[union-attr]
            seen += line
            if line.startswith("[train] step=") or time.monotonic() > deadline:
                break
        assert "[train] step=" in seen, seen[-3000:]
        run_id = _cluster(run_dir)["id"]
        assert _left_behind(run_id, run_dir), "nothing to tear down: wrong place looked in"
        job.send_signal(signum)
        job.communicate(timeout=60)
        assert job.returncode == 128 + signum, job.returncode
        assert _left_behind(run_id, run_dir) == []
    finally:  # a failed check must not leave a job training for ever beside the suite
        if job.poll() is None:
            job.terminate()
            job.communicate(timeout=60)


def test_a_lost_host_is_started_again_and_the_job_resumes(tmp_path: Path) -> None:
    """Every process of host 1 SIGKILLed at a step >= 120 (its launcher included): the
    launcher, as a cluster scheduler, starts host 1's launch again; torchrun's agent on host 0
    restarts its workers; the world resumes from the newest checkpoint and finishes, rc 0."""
    run_dir = tmp_path / "run"
    job = subprocess.Popen(
        [
            BASH,
            str(LAUNCHER),
            "train.steps=300",
            *TINY,
            f"run_dir={run_dir}",
            "checkpoint.every=50",
            "train.resume=auto",
        ],
        cwd=ROOT,
        env=_env(CONFIG="configs/tiny_cpu.yaml", LINK="1gbit"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen, killed = "", []
    for line in job.stdout:  # type: ignore[union-attr]
        seen += line
        if not killed and line.startswith("[train] step="):
            if int(line.split("step=")[1].split()[0]) >= 120:
                host = _cluster(run_dir)["hosts"][1]
                pids = subprocess.run(
                    ["ip", "netns", "pids", host["namespace"]], capture_output=True, text=True
                ).stdout.split()
                assert host["launcher_pid"] in map(int, pids), (host, pids)
                for pid in pids:
                    os.kill(int(pid), signal.SIGKILL)
                killed = pids
    job.wait(timeout=300)
    assert killed and job.returncode == 0, (job.returncode, seen[-3000:])
    assert "host 1's launch exited" in seen and "starting it again (1 of 3)" in seen
    log = (run_dir / "host_0.log").read_text()
    resumed = log.split("[resume] ")[-1].split("\n")[0]  # the restarted world's
    assert re.search(r": step (1|2)[05]0$", resumed), log[-2000:]  # a checkpoint after step 100
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 300 and summary["world_size"] == 4
    assert _cluster(run_dir)["hosts"][1]["launcher_pid"] != host["launcher_pid"]  # a new launch
    assert _left_behind(_cluster(run_dir)["id"], run_dir) == []
