"""``bench/chaos_check.py`` names each broken invariant, from records written by the trainer's
own writers (``sparse2d.ft.commit_log.CommitLog``, ``Recorder.write_summary``) into a run
directory laid out as a fault-tolerant run's, and from this machine's real processes and
namespaces. A clean run passes; each test breaks one invariant and finds it named."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
import chaos_check

from sparse2d.ft.commit_log import CommitLog
from sparse2d.train.config import load_config
from sparse2d.train.recorder import Recorder

GROUPS, STEPS = 3, 4
DIGESTS = ["aa" * 32, "bb" * 32]


def _write(
    run_dir: Path,
    commits: dict[int, list[tuple[int, str, int]]] | None = None,
    summaries: dict[int, dict | None] | None = None,
) -> None:
    """A clean 3-group run of ``STEPS`` steps (every group commits every step with the same
    digest in quorum 1), with ``commits`` (group: [(step, digest, pid)]) and ``summaries``
    (group: summary, None for none) replacing a group's."""
    cfg = load_config("bench/inputs/chaos.yaml", ["metrics.tensorboard=false"])
    for g in range(GROUPS):
        directory = run_dir / f"replica_{g}"
        log = CommitLog(str(directory), fresh=True)
        rows = (commits or {}).get(g) or [(s, f"{s:064x}", 100 + g) for s in range(1, STEPS + 1)]
        for step, digest, pid in rows:
            log.append(
                {
                    "step": step,
                    "quorum_id": 1 if pid < 200 else 2,
                    "participants": GROUPS if pid < 200 else 1,
                    "digest": digest,
                    "pid": pid,
                    "time": 1000.0 + step,
                }
            )
        summary = {
            "steps": STEPS,
            "final_step": STEPS,
            "eval_auc": 0.80,
            "state_digests": DIGESTS,
        }
        if summaries and g in summaries:
            summary = summaries[g]
        if summary is not None:
            Recorder(cfg, str(directory), is_main=True).write_summary(summary)


def _check(run_dir: Path, rc: int = 0, reference_auc: float = 0.80) -> list[chaos_check.Violation]:
    return chaos_check.check_run(
        run_dir,
        GROUPS,
        steps=STEPS,
        launcher_rc=rc,
        reference_auc=reference_auc,
        cluster_id=_unused_id(),
    )


def _unused_id() -> str:
    return "z" + uuid.uuid4().hex[:7]


def _names(violations: list[chaos_check.Violation]) -> list[str]:
    return [v.name for v in violations]


def test_a_clean_run_passes(tmp_path: Path) -> None:
    _write(tmp_path)
    assert _check(tmp_path) == []


def test_a_step_committed_by_two_quorums_with_different_weights_is_split_brain(
    tmp_path: Path,
) -> None:
    # group 2 committed step 3 alone (quorum 2) with other weights, then healed at step 4
    rows = [(1, f"{1:064x}", 102), (2, f"{2:064x}", 102), (3, "f" * 64, 202), (4, f"{4:064x}", 102)]
    _write(tmp_path, commits={2: rows})
    violations = _check(tmp_path)
    assert _names(violations) == ["split_brain"], violations
    assert "step 3 " in violations[0].detail and "quorum 2" in violations[0].detail


def test_a_committed_step_committed_again_is_redone(tmp_path: Path) -> None:
    # group 0 committed steps 1-3, then (same weights: no split brain) committed 2 and 3 again
    rows = [(s, f"{s:064x}", 100) for s in (1, 2, 3)] + [(s, f"{s:064x}", 150) for s in (2, 3, 4)]
    _write(tmp_path, commits={0: rows})
    violations = _check(tmp_path)
    assert _names(violations) == ["redone", "redone"], violations
    assert "group 0 committed step 2 again (pid 150" in violations[0].detail
    assert chaos_check.redone_count({0: [dict(step=s) for s in (1, 2, 2)]}) == 1


def test_replicas_not_identical_at_the_end_are_named(tmp_path: Path) -> None:
    other = {"steps": STEPS, "final_step": STEPS, "eval_auc": 0.80, "state_digests": DIGESTS[::-1]}
    _write(tmp_path, summaries={1: other})
    violations = _check(tmp_path)
    assert violations == [
        chaos_check.Violation(
            "not_identical", "group 1's final state digests differ from group 0's"
        )
    ]


@pytest.mark.parametrize(
    ("summary", "says"),
    [
        (None, "group 2 wrote no summary"),
        ({"ended": "group 0 finished the job", "final_step": 3}, "group 2 ended at step 3 of 4"),
    ],
)
def test_a_group_that_did_not_finish_is_named(
    tmp_path: Path, summary: dict | None, says: str
) -> None:
    _write(tmp_path, summaries={2: summary})
    violations = _check(tmp_path)
    assert _names(violations) == ["not_identical"] and says in violations[0].detail, violations


def test_an_auc_more_than_the_tolerance_below_the_reference_fails(tmp_path: Path) -> None:
    _write(tmp_path)
    assert _check(tmp_path, reference_auc=0.80 + 0.0049) == []
    violations = _check(tmp_path, reference_auc=0.80 + 0.0051)
    assert _names(violations) == ["auc"] * GROUPS, violations
    assert "0.0051 below" in violations[0].detail


def test_a_launcher_exit_other_than_0_fails(tmp_path: Path) -> None:
    _write(tmp_path)
    assert _check(tmp_path, rc=1) == [chaos_check.Violation("launcher", "the launcher exited 1")]


def test_a_process_of_the_cluster_left_running_is_named() -> None:
    """A real process carrying the cluster's mark (as every process the launcher starts)."""
    cluster = _unused_id()
    env = {**os.environ, chaos_check.MARK: cluster}
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        left = chaos_check.left_behind(cluster)
        assert [p.split()[0] for p in left["processes"]] == [str(stray.pid)], left
        violations = chaos_check.leftovers(left)
        assert _names(violations) == ["left_behind"] and str(stray.pid) in violations[0].detail
    finally:
        stray.kill()
        stray.wait()
    assert chaos_check.left_behind(cluster) == {"processes": [], "namespaces": [], "links": []}


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root; CI runs as root")
def test_a_namespace_of_the_cluster_left_behind_is_named() -> None:
    cluster = _unused_id()
    namespace = f"sparse2d-{cluster}-h0"
    subprocess.run(["ip", "netns", "add", namespace], check=True)
    try:
        left = chaos_check.left_behind(cluster)
        assert left["namespaces"] == [namespace], left
        assert _names(chaos_check.leftovers(left)) == ["left_behind"]
    finally:
        subprocess.run(["ip", "netns", "del", namespace], check=True)
