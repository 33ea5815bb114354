"""bench/sync_alone.py: a real 2-rank series with the sync timed after a barrier."""

from __future__ import annotations

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
from planner_holdout import Series
from sync_alone import measure


def test_the_sync_is_timed_apart_from_the_wait_on_every_rank() -> None:
    times = measure(Series("smoke", 2, ((2, 200, 8, "table_wise"),), 16), rounds=1)
    assert sorted(times) == [1, 2]
    for ranks in times.values():
        assert len(ranks) == 2
        for fwdbwd, wait, sync in ranks:
            assert fwdbwd > 0 and wait >= 0 and sync >= 0
    assert min(sync for _, _, sync in times[1]) > 0  # two replicas at L=1 average
