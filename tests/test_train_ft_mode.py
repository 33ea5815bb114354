"""The trainer's fault-tolerant mode (sparse2d.train.ft_mode) on bad input and lost coordination:
one line on every rank, in time.

One group (torchrun, 2 gloo ranks) of a job planned for 2 groups.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request

from sparse2d.ft.lighthouse import JOB_ENV, replica_id, start_lighthouse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _group(
    *overrides: str, timeout: float = 240, job: str | None = None, launched: str | None = None
) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    env.pop("TORCHFT_LIGHTHOUSE", None)
    env.pop(JOB_ENV, None)
    env.pop("SPARSE2D_FT_LAUNCH_TIME", None)
    if job is not None:
        env[JOB_ENV] = job
    if launched is not None:  # the job's launch time, as the launchers export it
        env["SPARSE2D_FT_LAUNCH_TIME"] = launched
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "sparse2d.train",
        "--config",
        "configs/ft_tiny_cpu.yaml",
        "train.steps=5",
        *overrides,
    ]
    start = time.monotonic()
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return run, time.monotonic() - start


def _lines(run: subprocess.CompletedProcess) -> list[str]:
    """Each rank's ``sparse2d.train: rank R: ...`` line. Found anywhere in a line of the
    shared pipe: torchft's Rust logger in a worker writes a line in parts, and a rank's line
    written between them lands after a timestamp (seen in a loaded run: the line was there,
    ``startswith`` missed it)."""
    return [
        line[line.index("sparse2d.train: rank ") :]
        for line in run.stderr.splitlines()
        if "sparse2d.train: rank " in line
    ]


def test_unreachable_lighthouse_stops_every_rank_in_one_line(tmp_path) -> None:
    with socket.socket() as s:  # bound, never listening: refused, and nobody else takes it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        run, _ = _group(
            f"fault_tolerance.lighthouse=http://127.0.0.1:{port}",
            "fault_tolerance.connect_timeout_s=2",
            f"run_dir={tmp_path}",
        )
    assert run.returncode != 0
    lines = _lines(run)
    assert sorted(line.split(":")[1] for line in lines) == [" rank 0", " rank 1"], run.stderr[
        -3000:
    ]
    for line in lines:
        assert (
            f"FaultToleranceError: lighthouse http://127.0.0.1:{port} unreachable within 2 s"
            in line
        )


def _ours(stderr: str) -> str:
    """The run's stderr without the lighthouse's and torchft's per-request INFO lines."""
    return "\n".join(line for line in stderr.splitlines() if "[INFO] [torchft::" not in line)


def test_quorum_below_min_replica_size_stops_every_rank_within_the_timeout(tmp_path) -> None:
    """Every rank of the group says why it stops, each in one line (the ranks meet in the
    group's store before raising and again after saying it: ``sparse2d.ft.quorum``)."""
    lighthouse = start_lighthouse(min_replicas=2)  # the other group never comes
    try:
        run, elapsed = _group(
            f"fault_tolerance.lighthouse={lighthouse.address()}",
            "fault_tolerance.min_replica_size=2",
            "fault_tolerance.quorum_timeout_s=5",
            f"run_dir={tmp_path}",
        )
    finally:
        lighthouse.shutdown()
    assert run.returncode != 0
    lines = _lines(run)
    ranks = sorted(line.split(":")[1] for line in lines)
    assert ranks == [" rank 0", " rank 1"], (elapsed, _ours(run.stderr)[-12000:])
    for line in lines:
        assert "no quorum of >= 2 group(s) within fault_tolerance.quorum_timeout_s=5" in line, line


def test_a_group_of_another_job_stops_every_rank_before_it_registers(tmp_path) -> None:
    """A lighthouse where job-a's groups heartbeat: a group of job-b (``$SPARSE2D_FT_JOB``)
    reaches it, and every rank stops in one line naming both jobs before its process group
    forms (``ft_mode.check_lighthouse``; the lighthouse never hears of job-b)."""
    import datetime

    from torchft._torchft import LighthouseClient

    lighthouse = start_lighthouse(min_replicas=1)
    try:
        address = lighthouse.address()
        LighthouseClient(address, datetime.timedelta(seconds=5)).heartbeat(replica_id(0, "job-a"))
        run, _ = _group(f"fault_tolerance.lighthouse={address}", f"run_dir={tmp_path}", job="job-b")
        with urllib.request.urlopen(address.rstrip("/") + "/status", timeout=5) as page:
            assert "job-b" not in page.read().decode()
    finally:
        lighthouse.shutdown()
    assert run.returncode != 0
    lines = _lines(run)
    # Rank 0 always says why. Rank 1 runs the same check and stops the same way, but once
    # rank 0 has exited torchrun may end rank 1 before it prints (seen in a loaded CI run).
    ranks = {line.split(":")[1] for line in lines}
    assert " rank 0" in ranks and ranks <= {" rank 0", " rank 1"}, _ours(run.stderr)[-3000:]
    for line in lines:
        assert "serves job job-a, and this group belongs to job job-b" in line, line


def _logged_steps(log_every: int, eval_every: int, save_every: int, steps: int) -> list[int]:
    """The steps the trainer's loop logs when each vote lands late where ``_may_defer``
    allows: after attempt ``k`` the loop sees ``k`` steps done if its vote is late, ``k+1``
    if it landed in ``step()`` (the late one before it lands at its forward)."""
    from types import SimpleNamespace

    from sparse2d.train.config import load_config
    from sparse2d.train.ft_mode import FaultTolerantMode

    cfg = load_config(
        "configs/ft_tiny_cpu.yaml",
        [
            f"train.log_every={log_every}",
            f"train.eval_every={eval_every}",
            f"checkpoint.every={save_every}",
            f"train.steps={steps}",
        ],
    )
    mode = SimpleNamespace(cfg=cfg)
    logged, last = [], 0
    for attempt in range(steps):
        late = FaultTolerantMode._may_defer(mode, attempt)  # type: ignore[arg-type]
        done = attempt if late else attempt + 1
        if done != last and (done % log_every == 0 or done == steps):
            logged.append(done)
        if done != last and (eval_every and done % eval_every == 0 or done == steps):
            assert not late, (attempt, done)  # evaluated after: a committed state
        last = done
    return logged


def test_late_votes_keep_every_logged_step_logged_once() -> None:
    """``FaultTolerantMode._may_defer``: the loop still logs every ``log_every``-th step once
    (and the last), evaluates and saves only committed states, whatever the cadences."""
    for log_every, eval_every, save_every, steps in [
        (10, 100, 0, 300),
        (3, 100, 0, 200),
        (1, 50, 0, 120),
        (7, 0, 50, 200),
        (10, 0, 0, 95),
    ]:
        want = [d for d in range(1, steps + 1) if d % log_every == 0 or d == steps]
        got = _logged_steps(log_every, eval_every, save_every, steps)
        assert got == want, (log_every, eval_every, save_every, steps, got)


def test_a_relaunched_group_is_told_from_a_fresh_one_by_its_steps_in_this_job(tmp_path) -> None:
    """A host's relaunch (torchrun restart 0 again) rejoins without the start wait when its
    group logged a train step since the job's launch; a fresh launch, or one whose records
    predate the launch (another job's run directory), waits for every group."""
    from sparse2d.train.config import load_config
    from sparse2d.train.ft_mode import _trained_since
    from sparse2d.train.recorder import Recorder

    cfg = load_config("bench/inputs/chaos.yaml", ["metrics.tensorboard=false"])
    recorder = Recorder(cfg, str(tmp_path), is_main=True, wall_time=True)
    metrics = str(tmp_path / "metrics.jsonl")
    assert not _trained_since(metrics, 0.0)  # no file: a fresh launch
    launched = float(int(time.time()))  # as the launcher exports it (date +%s)
    recorder.log({"kind": "start"}, 0)
    recorder.log({"kind": "train", "step": 5}, 5)
    recorder.close()
    assert _trained_since(metrics, launched)  # trained in this job: a relaunch
    assert not _trained_since(metrics, time.time() + 10)  # an earlier job's records


def test_a_relaunch_that_finds_the_job_finished_stops_instead_of_training_it_again(
    tmp_path,
) -> None:
    """Host 1 lost and relaunched (torchrun restart 0) after group 0 finished the job alone:
    its first quorum finds nobody, and it stops with the finished-job line. Breaks if the
    check is left to torchrun restarts (the relaunch then trained the whole job again
    alone from step 0, seen in the emulated host-loss test under load)."""
    import json

    from sparse2d.train.config import load_config
    from sparse2d.train.recorder import Recorder

    launched = str(int(time.time()) - 5)
    cfg = load_config("configs/ft_tiny_cpu.yaml", ["metrics.tensorboard=false"])
    group1 = tmp_path / "replica_1"
    recorder = Recorder(cfg, str(group1), is_main=True, wall_time=True)
    recorder.log({"kind": "start", "job": "relaunch-test"}, 0)  # this job's own records
    recorder.log({"kind": "train", "step": 3}, 3)  # trained in this job before it was lost
    recorder.close()
    (tmp_path / "replica_0").mkdir()
    (tmp_path / "replica_0" / "summary.json").write_text(json.dumps({"final_step": 5}))
    lighthouse = start_lighthouse(min_replicas=1)
    try:
        run, _ = _group(
            f"fault_tolerance.lighthouse={lighthouse.address()}",
            "fault_tolerance.replica_id=1",
            f"run_dir={tmp_path}",
            job="relaunch-test",
            launched=launched,
        )
    finally:
        lighthouse.shutdown()
    assert run.returncode == 0, _ours(run.stderr)[-6000:]
    ended = json.loads((group1 / "summary.json").read_text())
    assert ended.get("finished_by_group") == 0 and "nothing to rejoin" in ended["ended"], ended


def test_every_fault_tolerant_launcher_exports_the_launch_time() -> None:
    """A host relaunched into a running job rejoins at once only when its launcher exported
    ``SPARSE2D_FT_LAUNCH_TIME`` (``FTMode.rejoins``); without it the relaunch ran the fresh
    job's start wait and its polls tore down the live groups' process group for minutes."""
    for launcher in ("launch/ft_local.sh", "launch/emulated_hosts.sh", "launch/ft_slurm.sbatch"):
        with open(os.path.join(ROOT, launcher)) as f:
            text = f.read()
        assert 'export SPARSE2D_FT_LAUNCH_TIME="$(date +%s)"' in text, launcher
