"""``launch/emulated_hosts.sh``: several hosts on one machine, each a network namespace with
its own shaped link, one torchrun per host (real gloo over the hosts' interfaces).

Root only (namespaces, bridges, tc): CI runs as root; elsewhere these tests skip, saying why.
Each test's clusters carry one name (``CLUSTER_ID``, stable for this checkout and test) and are
removed by ``launch/emulated_cleanup.sh`` at its teardown, and by a rerun's start, even when a
timeout SIGKILLed the launcher.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reader_env import terminal_signals

ROOT = Path(__file__).resolve().parent.parent
LAUNCHER = ROOT / "launch" / "emulated_hosts.sh"
CLEANUP = ROOT / "launch" / "emulated_cleanup.sh"
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


@pytest.fixture(autouse=True)
def cluster_id(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """This test's cluster name, set for every launch in it (``CLUSTER_ID``); whatever the
    launcher's fate, the cluster is removed at teardown (which fails if anything stays)."""
    name = hashlib.sha1(f"{ROOT}:{request.node.nodeid}".encode()).hexdigest()[:8]
    monkeypatch.setenv("CLUSTER_ID", name)
    yield name
    _remove_cluster(name)


def _remove_cluster(name: str) -> str:
    """``launch/emulated_cleanup.sh NAME``: what it said (it fails naming anything left)."""
    done = subprocess.run([BASH, str(CLEANUP), name], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stderr


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
    command line names ``marker`` (every rank's names its run directory) or whose
    environment carries the run's name (the launcher marks all it starts), still there."""
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
    return left + _processes(marker, run_id)


def _processes(marker: Path, run_id: str | None = None) -> list[str]:
    """Processes whose command line names ``marker`` or (``run_id`` given) whose environment
    carries that cluster's name, as ``pid N: command line``."""
    mark = f"SPARSE2D_EMULATED_CLUSTER={run_id}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and proc.name != str(os.getpid()):
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                marked = run_id is not None and mark in (proc / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if marked or str(marker) in cmdline:
                found.append(f"pid {proc.name}: {cmdline[:80]}")
    return found


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
        ({"CLUSTER_ID": "My_Run"}, (), "CLUSTER_ID=My_Run: a cluster's name is 1 to 8 of 0-9 a-z"),
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


FT_JOB = (
    "model.tables=[{name: t, count: 2, rows: 400, dim: 16}]",
    "data.batch_size_per_rank=32",
    "train.steps=100000",
    "train.progress_bar=false",
)
"""A fault-tolerant job that trains until it is killed: its lighthouse runs outside every
host, so a namespace's processes are not all a killed launcher leaves."""


def _start_ft(run_dir: Path) -> subprocess.Popen:
    """``FT=1`` 2 hosts x 1 rank; returns once group 0 logged a train step (its output in
    ``run_dir/launcher.log``: nobody reads a pipe here)."""
    run_dir.mkdir(parents=True)
    with open(run_dir / "launcher.log", "w") as log:
        job = subprocess.Popen(
            [BASH, str(LAUNCHER), *FT_JOB, f"run_dir={run_dir}"],
            cwd=ROOT,
            env=_env(FT="1", NPROC="1", CONFIG="configs/ft_tiny_cpu.yaml", LINK="1gbit"),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    metrics = run_dir / "replica_0" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while '"kind": "train"' not in (metrics.read_text() if metrics.exists() else ""):
        assert job.poll() is None and time.monotonic() < deadline, (
            job.returncode,
            (run_dir / "launcher.log").read_text()[-3000:],
        )
        time.sleep(0.5)
    return job


def test_a_sigkilled_launcher_is_cleaned_by_the_next_start_and_by_teardown(
    tmp_path: Path, cluster_id: str
) -> None:
    """A timeout SIGKILLs the launcher (``subprocess.run(timeout=...)`` does): its trap never
    runs, and its hosts' torchrun sessions, namespaces, links and the lighthouse stay. The
    next start of that cluster name removes them before it makes its own; the teardown's
    ``launch/emulated_cleanup.sh NAME`` removes what a second SIGKILL left."""
    first, second = tmp_path / "first", tmp_path / "second"
    job = _start_ft(first)
    job.kill()
    job.wait(timeout=10)
    left = _left_behind(cluster_id, first)
    assert [n for n in left if n.startswith(f"sparse2d-{cluster_id}-h")], left  # namespaces
    assert any("sparse2d.ft.lighthouse" in x for x in left), left  # outside every host
    assert any("torch.distributed.run" in x for x in left), left
    job = _start_ft(second)  # same name: the stale cluster goes first
    log = (second / "launcher.log").read_text()
    assert f"emulated cleanup: cluster {cluster_id}: removed" in log, log[-3000:]
    assert _processes(first) == []  # the first cluster's, lighthouse included
    job.kill()
    job.wait(timeout=10)
    left = _left_behind(cluster_id, second)
    assert any("sparse2d.ft.lighthouse" in x for x in left), left  # something to clean
    said = _remove_cluster(cluster_id)  # what the teardown runs
    assert f"cluster {cluster_id}: removed" in said, said
    assert _left_behind(cluster_id, second) == []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert cluster_id not in netns, netns
