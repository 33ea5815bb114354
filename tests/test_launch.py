"""The launchers under failure: real torchrun, real gloo workers, real SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from sparse2d.checkpoint import latest
from tests import trainer_world
from tests.reader_env import reader_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = (
    "model.tables=[{name: t, count: 2, rows: 200, dim: 16}]",
    "data.batch_size_per_rank=32",
    "train.steps=200",
    "train.log_every=10",
    "train.eval_batches=2",
    "train.progress_bar=false",
    "checkpoint.every=50",
    "checkpoint.keep=2",
    "train.resume=auto",
)


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (torchrun's workers), from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry))
    return sorted(found)


def _launch(run_dir, *extra: str, restarts: int = 3, nproc: int = 2) -> subprocess.Popen:
    env = dict(os.environ, PYTHON=sys.executable, NPROC=str(nproc), MAX_RESTARTS=str(restarts))
    return subprocess.Popen(
        ["launch/local.sh", *TINY, f"run_dir={run_dir}", *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.slow
def test_sigkill_of_a_worker_restarts_and_resumes_exactly(tmp_path, world2) -> None:
    """Acceptance: SIGKILL of one worker at step >= 120 of 200 (checkpoints every 50): the job
    restarts by itself, resumes from the newest checkpoint it kept (step 100 or 150) and ends
    with the uninterrupted run's train and eval loss (within 1e-6). 2 ranks, L=1: two
    replicas that sync. Every table has an MCH managed-collision module in front (issue 31:
    MC models checkpoint), so the checkpoints carry identity tables and the resume is exact
    only if identities, their metadata and counters come back with the rows. The
    uninterrupted run is the same loop in the shared world (no launch), so this also checks
    that a torchrun launch and the in-process loop compute the same numbers."""
    two_d = ("parallel.sharding_group_size=1", "model.managed_collision.enabled=true")
    clean, _ = trainer_world.train(world2, *TINY, *two_d, f"run_dir={tmp_path / 'clean'}")

    job = _launch(tmp_path / "killed", *two_d)
    lines, killed = [], None
    deadline = time.monotonic() + 600
    for line in job.stdout:  # type: ignore[union-attr]
        lines.append(line)
        if killed is None and line.startswith("[train] step="):
            step = int(line.split("step=")[1].split()[0])
            if step >= 120:
                workers = _children(job.pid)
                assert len(workers) == 2, (workers, "".join(lines[-20:]))
                killed = (step, workers[1])
                os.kill(workers[1], signal.SIGKILL)
        assert time.monotonic() < deadline, "".join(lines[-50:])
    job.wait(timeout=60)
    text = "".join(lines)
    assert job.returncode == 0, text[-4000:]
    assert killed is not None and killed[0] < 200, text[-3000:]
    resumed = [line for line in lines if line.startswith("[resume] ")]
    checkpoints = tmp_path / "killed" / "checkpoints"
    assert resumed and str(checkpoints) in resumed[-1], resumed
    assert resumed[-1].rstrip().endswith(("step 100", "step 150")), resumed
    with open(tmp_path / "killed" / "summary.json") as f:
        after = json.load(f)
    assert after["steps"] == 200 and after["num_replicas"] == 2
    with open(os.path.join(latest(str(checkpoints)), "COMPLETE.json")) as f:
        identity_tables = json.load(f)["managed_collision"]
    assert sorted(identity_tables) == [f"t_{i}" for i in range(2)]
    assert {t["kind"] for t in identity_tables.values()} == {"mch"}
    records = map(json.loads, open(tmp_path / "killed" / "metrics.jsonl"))  # the restart loads
    starts = [r["construction"]["plan_cache"] for r in records if r["kind"] == "start"]  # its plan
    assert (starts[0], starts[-1]) == ("miss", "hit"), starts
    for key in ("train_loss", "eval_loss"):
        torch.testing.assert_close(after[key], clean[key], rtol=0, atol=1e-6)


@pytest.mark.slow
def test_lost_rank_never_hangs_the_others(tmp_path) -> None:
    """Acceptance: without restarts (no torchrun agent to stop them: as on other hosts), the
    survivors of a SIGKILLed rank stop by themselves within parallel.timeout_s + 30 s, each
    with one line naming the step and the lost rank (the ranks share this host)."""
    timeout_s = 10
    port = _port_no_one_else_is_given()
    argv = [
        sys.executable,
        "-m",
        "sparse2d.train",
        "--config",
        "configs/tiny_cpu.yaml",
        *TINY[:2],
        "train.steps=100000",
        "train.log_every=5",
        "train.progress_bar=false",
        f"parallel.timeout_s={timeout_s}",
        f"run_dir={tmp_path}",
    ]
    procs = []
    for rank in range(4):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE="4",
            LOCAL_WORLD_SIZE="4",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
        )
        with open(tmp_path / f"rank{rank}.err", "w") as err:  # the child keeps its own copy
            procs.append(
                subprocess.Popen(
                    argv,
                    cwd=ROOT,
                    env=env,
                    stderr=err,
                    text=True,
                    stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                )
            )
    try:
        for line in procs[0].stdout:  # type: ignore[union-attr]
            if line.startswith("[train] step=") and int(line.split("step=")[1].split()[0]) >= 10:
                break
        procs[1].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        for rank in (0, 2, 3):
            procs[rank].wait(timeout=timeout_s + 30)
        elapsed = time.monotonic() - killed_at
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert elapsed <= timeout_s + 30
    for rank in (0, 2, 3):
        assert procs[rank].returncode == 1, rank
        text = (tmp_path / f"rank{rank}.err").read_text()
        lines = [line for line in text.splitlines() if line.startswith("sparse2d.train:")]
        assert len(lines) == 1, (rank, text[-3000:])
        assert f"rank {rank}: lost contact with the job at step " in lines[0], lines[0]
        assert "lost rank(s) [1]" in lines[0], lines[0]


def _port_no_one_else_is_given() -> int:
    """A free port below the kernel's ephemeral range, for a bare env:// launch (rank 0 binds
    ``MASTER_PORT`` seconds later, after its imports). A port the kernel hands out (bind to
    0) can be given to another process's socket in between on a busy box; one below the
    range is given to nobody, and the suite binds fixed ports nowhere else (every other launch
    or store here binds port 0, or uses a ``FileStore``)."""
    import random
    import socket

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    torchrun = range(29400, 29600)  # its default store and launch/ft_local.sh's lighthouse
    candidates = [p for p in range(max(1024, low - 8000), low) if p not in torchrun]
    random.shuffle(candidates)
    for port in candidates[:200]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in [{max(1024, low - 8000)}, {low})")


LAUNCH_ERRORS = {
    "nproc_word": ("local.sh", {"NPROC": "four"}, "NPROC=four must be a whole number"),
    "nproc_zero": ("local.sh", {"NPROC": "0"}, "NPROC=0 must be >= 1"),
    "restarts": ("local.sh", {"MAX_RESTARTS": "-1"}, "MAX_RESTARTS=-1 must be a whole number"),
    "config": ("local.sh", {"CONFIG": "configs/nope.yaml"}, "'configs/nope.yaml': file not found"),
    "nnodes": ("multinode.sh", {"NODE_RANK": "0", "MASTER_ADDR": "h"}, "NNODES: set NNODES"),
    "node_rank": (
        "multinode.sh",
        {"NNODES": "2", "NODE_RANK": "2", "MASTER_ADDR": "h", "CONFIG": "configs/tiny_cpu.yaml"},
        "NODE_RANK < NNODES (got NNODES=2 NPROC=8 NODE_RANK=2)",
    ),
}


@pytest.mark.parametrize("case", sorted(LAUNCH_ERRORS))
def test_launcher_rejects_bad_environment_before_starting(case: str) -> None:
    script, env, message = LAUNCH_ERRORS[case]
    clean = {k: v for k, v in os.environ.items() if k not in ("NNODES", "NODE_RANK", "NPROC")}
    run = subprocess.run(
        [f"launch/{script}"],
        cwd=ROOT,
        env={**clean, "PYTHON": sys.executable, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode != 0
    assert message in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr


@pytest.mark.parametrize("script", ["local.sh", "multinode.sh", "ft_local.sh"])
def test_launcher_without_torch_says_make_install(tmp_path, script: str) -> None:
    """A fresh interpreter without the project's packages (the system python3 of a newcomer
    who did not `make install`): one line naming the interpreter and `make install`."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    hosts = dict(NNODES="1", NODE_RANK="0", MASTER_ADDR="h", CONFIG="configs/tiny_cpu.yaml")
    env = reader_env(PYTHON=str(bare / "bin" / "python"), **hosts)
    run = subprocess.run([f"launch/{script}"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 1 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "cannot import torch, torchrec and sparse2d: run 'make install'" in run.stderr


def test_launchers_default_to_the_project_venv() -> None:
    """Without PYTHON the launchers run .venv/bin/python (what make creates), not python3."""
    if not os.path.exists(os.path.join(ROOT, ".venv", "bin", "python")):
        pytest.skip("no .venv in this checkout (another TORCHREC set's venv runs the tests)")
    command = ["bash", "-c", 'source launch/python.sh && echo "$PYTHON"']
    run = subprocess.run(command, cwd=ROOT, env=reader_env(), capture_output=True, text=True)
    assert run.stdout.strip() == os.path.join(ROOT, ".venv", "bin", "python"), run.stderr


@pytest.mark.parametrize("where", ["proc", "file_parent"])
def test_unwritable_checkpoint_dir_fails_before_torchrun(tmp_path, where: str) -> None:
    """`launch/local.sh checkpoint.dir=... checkpoint.every=10` with a directory no one can
    make (tests run as root: /proc, or a file as parent): one line naming checkpoint.dir, in
    seconds, and no torchrun (it used to fail at the first save and restart three times)."""
    (tmp_path / "file").write_text("")
    target = "/proc/nope" if where == "proc" else str(tmp_path / "file" / "sub")
    command = ["launch/local.sh", f"checkpoint.dir={target}", "checkpoint.every=10"]
    start = time.monotonic()
    env = reader_env(PYTHON=sys.executable)
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and time.monotonic() - start < 20
    assert len(run.stderr.strip().splitlines()) == 1 and run.stdout == "", run.stderr
    assert run.stderr.startswith(f"sparse2d: config error: checkpoint.dir={target!r}: ")
    assert "set checkpoint.dir to a directory this user can write" in run.stderr


RANK_CONFIG_ERRORS = {  # what each launcher's own check cannot see, so only a rank finds it
    "local_device": ("local.sh", {}, ["device=cuda"], "device='cuda' but CUDA is not available"),
    # multinode.sh checks no paths (they may exist only on the compute hosts)
    "multinode_checkpoint_dir": (
        "multinode.sh",
        {"NNODES": "1", "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1"},
        ["checkpoint.dir=/proc/nope", "checkpoint.every=10"],
        "checkpoint.dir='/proc/nope': cannot create a directory",
    ),
}


@pytest.mark.parametrize("case", sorted(RANK_CONFIG_ERRORS))
def test_a_config_error_found_on_a_rank_is_not_restarted(tmp_path, case: str) -> None:
    """A ConfigError that only the ranks find, under the launcher as typed with restarts on
    (MAX_RESTARTS=3, its default): the rank's one line is the launch's whole output, exit 1,
    and no restart (each round would print the line again and add ~10 s; torchrun's agent
    used to run all four rounds and end in a ~70-line ChildFailedError report)."""
    if case == "local_device" and torch.cuda.is_available():
        pytest.skip("this host has CUDA: device=cuda is valid here")
    script, env, overrides, expected = RANK_CONFIG_ERRORS[case]
    env = reader_env(NPROC="2", MAX_RESTARTS="3", CONFIG="configs/tiny_cpu.yaml", **env)
    env["MASTER_PORT"] = str(_port_no_one_else_is_given())  # multinode.sh's rendezvous
    two_d = "parallel.sharding_group_size=1"  # 2 processes in 2D: no 1D note on rank 0
    command = [f"launch/{script}", f"run_dir={tmp_path}", two_d, *overrides]
    start = time.monotonic()
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    wall = time.monotonic() - start
    lines = (run.stdout + run.stderr).strip().splitlines()
    assert run.returncode == 1 and len(lines) == 1, run.stdout + run.stderr
    assert lines[0].startswith("sparse2d.train: rank 0: ConfigError: ") and expected in lines[0]
    assert wall < 60, f"{wall:.0f} s: restarted?"
