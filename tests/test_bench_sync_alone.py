"""bench/sync_alone.py: a real 2-rank series with the sync timed after a barrier, in parts."""

from __future__ import annotations

import pytest

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
from planner_holdout import Series
from sync_alone import PARTS, measure


def test_the_sync_is_timed_apart_from_the_wait_and_split_into_its_parts() -> None:
    times = measure(Series("smoke", 2, ((2, 200, 8, "table_wise"),), 16), rounds=1)
    assert sorted(times) == [1, 2]
    for ranks in times.values():
        assert len(ranks) == 2
        for rank in ranks:
            assert rank["fwdbwd"] > 0 and rank["wait"] >= 0 and rank["sync"] >= 0
            assert sum(rank[p] for p in PARTS) <= rank["sync"] * 1.01 + 1e-4  # parts of it
    for rank in times[1]:  # two replicas at L=1 average: every part ran
        assert rank["sync"] > 0
        assert all(rank[p] > 0 for p in ("payload", "scan", "start", "land")), rank
    for rank in times[2]:  # L = world: nothing to average
        assert all(rank[p] == 0 for p in PARTS), rank


def test_crossover_times_each_replicated_L_in_place_and_copied(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import planner_holdout
    import sync_alone

    smoke = Series("smoke_crossover", 2, ((2, 200, 8, "table_wise"),), 16)
    original = planner_holdout.SERIES
    sync_alone.SERIES = (*original, smoke)
    try:
        sync_alone.crossover([smoke.name], rounds=1)
    finally:
        sync_alone.SERIES = original
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and "smoke_crossover L=1 0.01 MB" in lines[1], lines
    assert "faster" in lines[1]
