"""``bench/chaos.py``: its schedule is a pure function of the seed, and a short chaos run (three
faults on 3 emulated hosts x 2 ranks) passes ``bench/chaos_check.py``.

The run needs root (namespaces, tc): CI runs as root; elsewhere it skips. Its cluster is
named by this checkout (``cluster_faults.cluster_name``): the run's own teardown and the next
start of that name remove what a killed run left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
import chaos

ROOT = Path(__file__).resolve().parents[1]


def _schedule_elsewhere(seed: int, hash_seed: str) -> list[dict]:
    """``schedule(seed)`` computed by a fresh interpreter (another hash seed, no shared state)."""
    code = "import json, sys; import chaos; print(json.dumps(chaos.schedule(int(sys.argv[1]))))"
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": f"{ROOT / 'bench'}:{ROOT}"}
    done = subprocess.run(
        [sys.executable, "-c", code, str(seed)], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


def test_the_same_seed_replays_the_same_schedule() -> None:
    """Breaks if a draw reads the global ``random`` (or a set's order): another interpreter,
    with another hash seed, then draws another schedule."""
    for seed in (1, 2, 3):
        here = json.loads(json.dumps(chaos.schedule(seed)))
        assert here == _schedule_elsewhere(seed, "1") == _schedule_elsewhere(seed, "2")
    assert chaos.schedule(1) != chaos.schedule(2)


@pytest.mark.parametrize("seed", range(20))
def test_every_schedule_holds_every_kind_in_its_bounds(seed: int) -> None:
    faults = chaos.schedule(seed)
    assert len(faults) >= 8 and set(chaos.KINDS) <= {f["kind"] for f in faults}
    steps = [f["at"] for f in faults]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    assert chaos.STEPS // 20 <= steps[0] and steps[-1] < chaos.STEPS * 6 // 10
    for f in faults:
        if f["kind"] == "partition":
            assert 10 <= f["seconds"] <= 40
        if f["kind"] == "two_hosts":
            assert len(set(f["hosts"])) == 2


def test_a_schedule_needs_room_for_every_kind_and_a_survivor() -> None:
    with pytest.raises(ValueError, match="every kind once"):
        chaos.schedule(1, faults=6)
    with pytest.raises(ValueError, match="third to survive"):
        chaos.schedule(1, hosts=2)


def test_a_gap_spanning_the_next_strike_is_the_next_faults_stall() -> None:
    """A partition of host 1 (survivors 0 and 2), then host 2's rank killed 15 s later: the
    killed group's 25 s relaunch gap begins inside the partition's window but is the kill's.
    Breaks if ``stall`` reads gaps past the next strike (CI read 30.5 s that way)."""
    steady = [100.0 + 0.05 * i for i in range(20)]  # ~101 s: the last commit before the cut
    after_cut = [114.0 + 0.05 * i for i in range(20)]  # resumed 13 s later
    commits = {
        0: [{"time": t} for t in steady + after_cut],
        2: [{"time": t} for t in steady + after_cut[:5] + [140.0, 140.05]],
    }
    partition = {"start": 101.0, "end": 111.0}
    kill = {"start": 114.3, "end": 114.3}
    result = {"commits": commits}
    assert 12.9 < chaos.stall(result, partition, [0, 2], until=kill["start"]) < 13.1
    assert chaos.stall(result, partition, [0, 2]) > 25  # unbounded: the kill's gap
    assert chaos.stall(result, kill, [0], until=float("inf")) < 0.1


SHORT_STEPS = 1200
SHORT = [
    {"kind": "partition", "at": 100, "host": 1, "seconds": 10.0},
    {"kind": "rank_kill", "at": 250, "host": 2, "rank": 1},
    {"kind": "lighthouse", "at": 400, "seconds": 2.0},
]
"""A partition, a lost rank and the lighthouse restarted: three faults in ~90 s."""


@pytest.mark.slow
@pytest.mark.skipif(
    os.geteuid() != 0, reason="emulated hosts need root (ip netns, bridges, tc); CI runs as root"
)
def test_a_short_chaos_run_keeps_every_invariant(tmp_path: Path) -> None:
    """Every invariant but the AUC (an uninterrupted run would double the test; the bench
    compares with one): no split brain, no step redone, replicas identical, launcher exit 0,
    nothing left behind; and each fault was felt."""
    result = chaos.run(None, tmp_path, steps=SHORT_STEPS, faults=SHORT, name_key="test-short")
    result["steps"] = SHORT_STEPS
    a = chaos.analyse(result, reference_auc=None)
    assert [e["kind"] for e in result["events"]] == [f["kind"] for f in SHORT], result["tail"]
    assert [v for v in a["violations"] if v["name"] != "auc"] == [], (a, result["tail"])
    # felt: the partition stalled the survivors' commits past a normal step, the killed rank's
    # group restarted (its heal is logged), and the lighthouse was started again
    assert a["rows"][0]["stall_s"] > 5 * a["step_s"], a
    assert result["summaries"][2]["restart_count"] >= 1, result["summaries"][2]
    assert result["events"][2]["new_pid"] != result["events"][2]["killed_pid"]
    assert a["partition_stall_s"] <= a["partition_bound_s"], a
