"""bench/sync_alone.py: a real 2-rank series with the sync timed after a barrier and split
into its parts, with payloads in place and copied alternated in one world."""

from __future__ import annotations

import pytest

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
import planner_holdout
import sync_alone
from planner_holdout import Series
from sync_alone import NEVER, PARTS, measure_settings

SMOKE = Series("smoke", 2, ((2, 200, 8, "table_wise"),), 16)


@pytest.fixture(scope="module")
def timed() -> dict:
    return measure_settings(SMOKE, rounds=1, limits=(0, NEVER))


@pytest.mark.parametrize("limit", [0, NEVER])
def test_the_sync_is_timed_apart_from_the_wait_and_split_into_its_parts(timed, limit) -> None:
    times = timed[limit]
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


def test_crossover_prints_each_replicated_L_in_place_and_copied(timed, monkeypatch) -> None:
    """The crossover table from the smoke world's real timings (measured once, above)."""
    monkeypatch.setattr(sync_alone, "SERIES", (*planner_holdout.SERIES, SMOKE))
    monkeypatch.setattr(sync_alone, "measure_settings", lambda series, rounds, limits: timed)
    lines = sync_alone.crossover([SMOKE.name], rounds=1)
    assert len(lines) == 2  # the header and L=1 (at L=2 = world nothing is averaged)
    place, copied = (max(r["sync"] for r in timed[k][1]) * 1e3 for k in (0, NEVER))
    faster = "in place" if place < copied else "copied"
    assert lines[1] == f"  smoke L=1 0.01 MB: {place:.1f} / {copied:.1f} ({faster} faster)"
