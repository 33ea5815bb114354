"""launch/ft_local.sh under failure: a lighthouse, G torchruns (one per sharding group), real
SIGKILL of a worker. Only the hit group restarts; it heals from a live group, no checkpoint.

Timeouts used (fault_tolerance.* and the lighthouse's): a killed worker resets its sockets,
so the survivors' cross-group all-reduce fails at once and their step fails its commit; the
next quorum waits until the lost group's manager stops heartbeating (torchrun stops the
rest of that group within its 0.1 s monitor interval; the lighthouse drops a silent group
after 2 s). So a survivor stalls ~2-4 s; the restarted group needs its start-up (imports,
sharding) plus one heal.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import IO

import pytest

from bench.ft_workers import workers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS, KILL_AT = 1000, 120
"""1000 steps (the acceptance's run). The survivor trains on alone while the killed group
restarts (~150-300 steps on 2 cores, whatever their speed: a slow box slows both), and that
group's slices of those steps are skipped by design (15-30% of one group's data). The eval
covers 64 batches: with 4, the AUC of two runs differed by up to 0.005 from eval noise alone;
with 64, a 1500-step run killed at step 120 ended 0.0012-0.0021 from the uninterrupted one
(280 steps skipped) and a 1000-step run 0.0023 (232 skipped, 2026-11-26), with 4 tables.
Two tables (2026-11-27): 0.0029 and 0.0025 (240 and 352 steps skipped); each launch costs
~22% fewer CPU seconds (160 against 204 for 1000 uninterrupted steps, managed collision
being per table), and the suite is CPU-bound on 2 cores."""
TINY = (
    "model.tables=[{name: t, count: 2, rows: 400, dim: 16}]",
    "data.batch_size_per_rank=32",
    f"train.steps={STEPS}",
    "train.log_every=10",
    "train.eval_batches=64",
    "fault_tolerance.timeout_s=20",
    "fault_tolerance.quorum_timeout_s=60",
)


PIPELINE_MC = ("train.pipeline=sparse_dist", "model.managed_collision.enabled=true")
"""Sync every step (the config's). Tried every 4 steps (2026-11-26): each 1000-step launch
ran ~20 s faster, but the survivor trained further alone while group 1 restarted (320
skipped steps against ~260) and the killed run ended 0.00506 of AUC from the uninterrupted
one, past the 0.005 bound."""

CHECKPOINTS = f"checkpoint.every={STEPS // 2}"
"""The kill test's uninterrupted launch keeps checkpoints (steps 500 and 1000) for the
relaunch that follows it."""


def launch(
    run_dir,
    groups: int,
    *extra: str,
    nproc: int = 2,
    restarts: int = 2,
    min_replicas: int = 1,
    out: IO[str] | None = None,
) -> subprocess.Popen:
    """Start launch/ft_local.sh, with its default lighthouse port (a free one) and job name;
    its output goes to a pipe, or to ``out`` (a job nobody reads while it runs must not block
    on a full pipe)."""
    env = dict(
        os.environ,
        PYTHON=sys.executable,
        NGROUPS=str(groups),
        NPROC=str(nproc),
        MAX_RESTARTS=str(restarts),
        MIN_REPLICAS=str(min_replicas),
        PYTHONPATH=ROOT,
    )
    for name in ("TORCHFT_LIGHTHOUSE", "LIGHTHOUSE_PORT", "SPARSE2D_FT_JOB"):
        env.pop(name, None)
    return subprocess.Popen(
        ["launch/ft_local.sh", *TINY, f"run_dir={run_dir}", *extra],
        cwd=ROOT,
        env=env,
        stdout=out or subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_and_kill(
    run_dir,
    groups: int,
    group: int,
    local_rank: int,
    *extra: str,
    nproc: int = 2,
    timeout: float = 400,
):
    """Launch, SIGKILL ``group``'s ``local_rank`` once it logged step >= KILL_AT; return
    (stdout lines, step at the kill, pids of every other group's workers at the kill)."""
    job = launch(run_dir, groups, *extra, nproc=nproc)
    lines, killed, others = [], None, {}
    deadline = time.monotonic() + timeout
    try:
        for line in job.stdout:  # type: ignore[union-attr]
            lines.append(line)
            prefix = f"[train] replica={group} step="
            if killed is None and line.startswith(prefix):
                step = int(line[len(prefix) :].split()[0])
                if step >= KILL_AT:
                    others = {g: workers(g, run_dir) for g in range(groups) if g != group}
                    victim = workers(group, run_dir)[local_rank]
                    os.kill(victim, signal.SIGKILL)
                    killed = step
            assert time.monotonic() < deadline, "".join(lines[-40:])
        job.wait(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, "".join(lines[-60:])
    assert killed is not None, "".join(lines[-40:])
    return lines, killed, others


def summary(run_dir, group: int) -> dict:
    with open(os.path.join(run_dir, f"replica_{group}", "summary.json")) as f:
        return json.load(f)


def train_records(run_dir, group: int) -> list[dict]:
    with open(os.path.join(run_dir, f"replica_{group}", "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["kind"] == "train"]


def test_sigkill_in_group_1_heals_from_group_0_and_group_0_never_stops(tmp_path) -> None:
    """Driven by TorchRec's TrainPipelineSparseDist (FTOptimizer's step boundaries), with
    managed-collision (MCH) tables: the digests cover identity tables, so bit-identical
    groups hold the same identities too. The uninterrupted reference launch also keeps DCP
    checkpoints, which a relaunch after every group is gone resumes from
    (``relaunch_resumes_from_checkpoints``)."""
    lines, killed, others = run_and_kill(tmp_path / "killed", 2, 1, 1, *PIPELINE_MC)
    g0, g1 = summary(tmp_path / "killed", 0), summary(tmp_path / "killed", 1)
    # Group 0: never restarted (the same worker PIDs), never redid a committed step.
    assert g0["restart_count"] == 0 and sorted(g0["pids"]) == sorted(others[0].values())
    # Every step committed once; if a step of group 0 failed while group 1 (healed) committed
    # it, group 0 takes that step by a heal instead (it never commits a step twice).
    healed = sum(h["step"] - h["from_step"] for h in g0["heals"])
    assert g0["final_step"] == STEPS and g0["committed_steps"] + healed == STEPS, g0
    steps0 = [r["step"] for r in train_records(tmp_path / "killed", 0)]
    assert steps0 == sorted(set(steps0)) and steps0[-1] == STEPS
    # ... and kept committing while group 1 was down (a logged window with 1 participant).
    assert any(r["participants"] == 1 for r in train_records(tmp_path / "killed", 0)), steps0
    # Group 1 restarted and healed from group 0 (each rank from its peer), after the kill.
    assert g1["restart_count"] >= 1 and g1["pids"] != g0["pids"]
    # one restart heal per kill (from step 0: a new process), listed with every restart's
    late = [h for h in g1["heals"] if h["step"] > killed and h["from_step"] == 0]
    assert len(late) == 1 and late[0]["from_group"] == 0 and late[0]["bytes"] > 0, g1["heals"]
    # ... and built its model from the plan stored under RUN_DIR/plans: no planning to heal.
    with open(os.path.join(tmp_path / "killed", "replica_1", "metrics.jsonl")) as f:
        starts = [
            r["construction"]["plan_cache"] for r in map(json.loads, f) if r["kind"] == "start"
        ]
    assert len(starts) >= 2 and starts[-1] == "hit", starts
    assert g1["final_step"] == STEPS and g1["min_groups_in_step"] == 2
    assert g0["min_groups_in_step"] == 1
    assert g0["samples_skipped"] == g1["samples_skipped"] > 0  # group 1's missed slices
    # Bit-identical replicas after the final sync (rank r of each group).
    assert g0["state_digests"] == g1["state_digests"]
    assert g0["eval_auc"] == g1["eval_auc"]
    # The same job uninterrupted: the kill costs at most 0.005 of eval AUC. It also keeps
    # DCP checkpoints (at steps 500 and 1000; saving does not change what it trains), which
    # the relaunch below resumes from.
    clean = launch(tmp_path / "clean", 2, *PIPELINE_MC, CHECKPOINTS)
    out, _ = clean.communicate(timeout=400)
    assert clean.returncode == 0, out[-3000:]
    reference = summary(tmp_path / "clean", 0)
    assert reference["failed_commits"] == 0 and reference["min_groups_in_step"] == 2
    assert abs(g0["eval_auc"] - reference["eval_auc"]) <= 0.005, (g0["eval_auc"], reference)
    relaunch_resumes_from_checkpoints(tmp_path / "clean")


def relaunch_resumes_from_checkpoints(run_dir) -> None:
    """Every group gone (here: the job ended at step 1000): a new launch with
    train.resume=auto loads each group's own DCP checkpoint, managed-collision identity
    tables and their metadata included, and goes on through TorchRec's pipeline; the groups
    end bit-identical (a group may heal from one that resumed instead). One launch of 20
    steps on the kill test's uninterrupted run instead of two launches of their own: each
    launch's start-up (imports, a lighthouse, two torchruns) is most of a short job's CPU
    seconds, and the suite is CPU-bound on 2 cores."""
    # a save of group 0 cut short after the last complete one: named, never read
    partial = run_dir / "replica_0" / "checkpoints" / f"step_{STEPS + 10}.tmp-cut"
    partial.mkdir()
    again = launch(
        run_dir, 2, *PIPELINE_MC, CHECKPOINTS, f"train.steps={STEPS + 20}", "train.resume=auto"
    )
    out, _ = again.communicate(timeout=300)
    assert again.returncode == 0, out[-3000:]
    assert f"[resume] not read: {partial.name}, a save that never completed" in out, out[-3000:]
    resumed = [line for line in out.splitlines() if line.startswith("[resume] replica=")]
    assert any(f" step={STEPS} " in f"{line} " for line in resumed), out[-3000:]
    s = [summary(run_dir, g) for g in (0, 1)]
    for g in (0, 1):
        assert s[g]["final_step"] == STEPS + 20 and s[g]["committed_steps"] == 20, s[g]
    assert s[0]["state_digests"] == s[1]["state_digests"]


def _field(line: str, key: str) -> int:
    return int(line.split(f" {key}=", 1)[1].split()[0])


ALL_THREE_ZCH = (
    "fault_tolerance.quorum_timeout_s=300",
    "model.managed_collision.enabled=true",
    "model.managed_collision.kind=zch",
    "parallel.sync.every=4",
)
"""The three-group job, launched with MIN_REPLICAS=3: a step needs every group, so the others
wait while one restarts. The kills then land before the job ends however slow a restart is
(113 s on a box loaded 20 deep, against ~150 steps on a quiet one), no slice is skipped, and
a killed group heals at the step it was killed at. MP-ZCH tables: the digests cover their
identities and metadata. A sync every 4 steps: kills land between syncs, so a heal replaces
a group's unsynced state; the job's last sync is forced, so all end bit-identical (and the
job's steps cost ~40% less: MP-ZCH's identity merge is per sync). Training on while a group
is down is the two-group test's claim."""


def kill_in_turn(run_dir, steps: int, *extra: str, timeout: float = 900) -> tuple[list[dict], dict]:
    """3 groups x 1 rank: SIGKILL group 2 at step >= KILL_AT; once it healed, the group it
    healed from; once that one healed, the remaining group. Every group is hit once, each
    kill 40 steps after the previous heal. Returns the kills ({group, step, healed_from,
    healed_at}) and the launcher's stdout text.

    A kill's heal is the killed group's heal from step 0 (its new process) past the kill
    step: a ``[heal]`` line of the group's old process (a survivor taking one failed step by
    a heal, ``from_step > 0``) can still be in the pipe when the kill is sent, and counting
    it would send the next kill while the group is still down."""
    job = launch(run_dir, 3, f"train.steps={steps}", *extra, nproc=1, min_replicas=3)
    lines, kills, order = [], [], [2]
    deadline = time.monotonic() + timeout
    try:
        for line in job.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith("[heal] replica=") and kills and "healed_from" not in kills[-1]:
                group, step = _field(line, "replica"), _field(line, "step")
                fresh = _field(line, "from_step") == 0
                if group == kills[-1]["group"] and step >= kills[-1]["step"] and fresh:
                    kills[-1]["healed_from"] = source = _field(line, "from_group")
                    kills[-1]["healed_at"] = step
                    if len(order) < 3:  # next: the group it healed from, then the last one
                        order.append(
                            source if source not in order else ({0, 1, 2} - {*order, source}).pop()
                        )
            due = len(kills) < len(order) and (not kills or "healed_from" in kills[-1])
            target = order[len(kills)] if due else None
            prefix = f"[train] replica={target} step="
            if target is not None and line.startswith(prefix):
                step = int(line[len(prefix) :].split()[0])
                if step >= max(KILL_AT, kills[-1]["healed_at"] + 40 if kills else 0):
                    os.kill(workers(target, run_dir)[0], signal.SIGKILL)
                    kills.append({"group": target, "step": step})
            assert time.monotonic() < deadline, "".join(lines[-40:])
        job.wait(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, "".join(lines[-60:])
    return kills, "".join(lines)


@pytest.mark.slow
def test_three_groups_killed_in_turn_each_heal_once_and_end_identical(tmp_path) -> None:
    """Repeated failures hitting every group, including the one the others healed from
    (each group's rank 0 hosts its torchft manager, so its heartbeat stops with it): the
    launcher exits 0, every kill is followed by exactly one heal of that group, no group
    logs a step twice, all three end bit-identical (MP-ZCH identities included) with the
    AUC of an uninterrupted run. 300 steps: the others wait while a group restarts
    (MIN_REPLICAS=3), so the three kills land by step ~220 however slow the box is."""
    steps = 300
    # The uninterrupted reference runs beside the killed job: while a group restarts the
    # others wait (MIN_REPLICAS=3) and a core would idle; its own quorums need all 3 of its
    # groups, so the load only slows it.
    with open(tmp_path / "clean.out", "w") as clean_out:
        clean = launch(
            tmp_path / "clean",
            3,
            f"train.steps={steps}",
            *ALL_THREE_ZCH,
            nproc=1,
            min_replicas=3,
            out=clean_out,
        )
        try:
            kills, out = kill_in_turn(tmp_path / "killed", steps, *ALL_THREE_ZCH)
            clean.wait(timeout=600)
        finally:
            if clean.poll() is None:
                clean.kill()
    assert clean.returncode == 0, (tmp_path / "clean.out").read_text()[-3000:]
    assert [k["group"] for k in kills][0] == 2 and len(kills) == 3, (kills, out[-3000:])
    assert sorted(k["group"] for k in kills) == [0, 1, 2], kills
    assert kills[1]["group"] == kills[0]["healed_from"], kills  # the source of a heal is hit
    assert all("healed_from" in k for k in kills), kills
    s = [summary(tmp_path / "killed", g) for g in range(3)]
    for g in range(3):
        mine = [k for k in kills if k["group"] == g]
        # From the summary, which lists the heals of every process of the group: one restart
        # heal per kill, each after its kill, from the group the launcher's line named. A
        # restarted process heals from step 0; a survivor whose step failed may take one
        # step by a heal too (from_step > 0): that is not a restart's heal.
        restarts = [h for h in s[g]["heals"] if h["from_step"] == 0 and h["step"] > 0]
        assert len(restarts) == len(mine) == s[g]["restart_count"], (g, kills, s[g]["heals"])
        for heal, kill in zip(restarts, mine, strict=True):
            assert heal["step"] == kill["healed_at"] >= kill["step"], (g, kill, heal)
            assert heal["from_group"] == kill["healed_from"] and heal["bytes"] > 0, (g, heal)
        assert s[g]["final_step"] == steps and s[g]["min_groups_in_step"] == 3, s[g]
        logged = [r["step"] for r in train_records(tmp_path / "killed", g)]
        assert len(logged) == len(set(logged)), g  # no step logged twice, across restarts
    assert s[0]["state_digests"] == s[1]["state_digests"] == s[2]["state_digests"]
    reference = summary(tmp_path / "clean", 0)
    assert abs(s[0]["eval_auc"] - reference["eval_auc"]) <= 0.005, (s[0], reference)


def test_every_group_lost_without_a_checkpoint_stops_the_job_with_one_line(tmp_path) -> None:
    """SIGKILL the worker of every group (2 x 1 rank) with no checkpoint: the restarted groups
    find nobody ahead of step 0, so there is nothing to heal or resume from. Each stops with
    one line instead of silently training the job again from step 0; the launcher fails."""
    job = launch(tmp_path, 2, "train.steps=400", nproc=1, restarts=1)
    lines, killed, done = [], set(), False
    try:
        for line in job.stdout:  # type: ignore[union-attr]
            lines.append(line)
            for g in (0, 1):
                if g not in killed and line.startswith(f"[train] replica={g} step="):
                    killed.add(g)
            if killed == {0, 1} and not done:
                for pid in [pid for g in (0, 1) for pid in workers(g, tmp_path).values()]:
                    os.kill(pid, signal.SIGKILL)
                done = True
        job.wait(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode != 0 and done, "".join(lines[-40:])
    for g in (0, 1):
        with open(tmp_path / f"replica_{g}.log") as f:
            log = f.read()
        assert f"FaultToleranceError: group {g}: every replica group was lost" in log, log[-3000:]
        assert not os.path.exists(tmp_path / f"replica_{g}" / "summary.json")


SIDE_BY_SIDE = ("train.steps=120", "train.eval_batches=8")


def test_two_jobs_side_by_side_each_form_their_own_quorums_and_both_leave_summaries(
    tmp_path,
) -> None:
    """Two launches 2 s apart on one host, each with the launcher's defaults: each starts its
    own lighthouse (a free port, its own job name), no group of one job ever counts a group of
    the other in its quorum, and both end 0 with every group's summary. In job B, group 1 is
    frozen near the end until group 0 has finished alone, then SIGKILLed: torchrun restarts it
    after the job is done, and it leaves a summary that says so and names the finisher."""
    with open(tmp_path / "a.out", "w") as a_out:
        a = launch(tmp_path / "a", 2, *SIDE_BY_SIDE, nproc=1, out=a_out)
        time.sleep(2)
        # B's group 0 waits this long in its all-reduce with the frozen group
        b = launch(tmp_path / "b", 2, *SIDE_BY_SIDE, "fault_tolerance.timeout_s=5", nproc=1)
        lines, frozen = [], None
        try:
            for line in b.stdout:  # type: ignore[union-attr]
                lines.append(line)
                if frozen is None and line.startswith("[train] replica=1 step="):
                    if _field(line, "step") >= 60:
                        frozen = workers(1, tmp_path / "b")[0]
                        os.kill(frozen, signal.SIGSTOP)
                if frozen and line.startswith("final replica=0 "):
                    os.kill(frozen, signal.SIGKILL)
            b.wait(timeout=120)
            a.wait(timeout=300)
        finally:
            for job in (a, b):
                if job.poll() is None:
                    job.kill()
    out_a = (tmp_path / "a.out").read_text()
    assert a.returncode == 0, out_a[-3000:]
    assert b.returncode == 0 and frozen, "".join(lines[-40:])
    ports = {(tmp_path / j / "lighthouse.port").read_text() for j in ("a", "b")}
    assert len(ports) == 2, ports
    # every quorum each lighthouse formed held its own job's groups only
    jobs = [
        set(
            re.findall(
                r'replica_id: "sparse2d_job_([^"]+)_group_[0-9]+:',
                (tmp_path / j / "lighthouse.log").read_text(),
            )
        )
        for j in ("a", "b")
    ]
    assert len(jobs[0]) == len(jobs[1]) == 1 and jobs[0] != jobs[1], jobs
    for g in (0, 1):
        s = summary(tmp_path / "a", g)
        assert s["final_step"] == 120, s
        for job in ("a", "b"):
            assert max(r["participants"] for r in train_records(tmp_path / job, g)) <= 2
    assert summary(tmp_path / "b", 0)["final_step"] == 120
    ended = summary(tmp_path / "b", 1)
    assert ended["finished_by_group"] == 0 and ended["restart_count"] == 1, ended
    assert 60 <= ended["final_step"] < 120 and "nothing to rejoin" in ended["ended"], ended
    said = [x for x in lines if x.startswith("[done] replica=1 ")]
    assert len(said) == 1 and "summary.json" in said[0], "".join(lines[-40:])
