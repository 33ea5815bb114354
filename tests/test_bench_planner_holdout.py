"""bench/planner_holdout.py: one real 2-rank series, timed the way the fit reads it."""

from __future__ import annotations

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
from planner_holdout import FIT_SERIES, SERIES, Series, measure


def test_a_series_is_timed_as_the_slowest_ranks_step() -> None:
    tiny = Series("smoke", 2, ((2, 200, 8, "row_wise"),), 16)
    measured = measure(2, [tiny], rounds=1, steps=1)["smoke"]
    assert "error" not in measured, measured
    assert measured["timing"] == "slowest rank's step"
    assert sorted(measured["points"]) == [1, 2]
    for point in measured["points"].values():
        # the sync is what the slowest rank's step adds to the slowest forward+backward
        assert point["step"] >= point["fwdbwd"] > 0
        assert point["sync"] == max(0.0, point["step"] - point["fwdbwd"])


def test_fit_and_held_out_series_are_disjoint() -> None:
    fit = {(s.world, s.tables, s.batch, s.fwd, s.bwd) for s in FIT_SERIES}
    held = {(s.world, s.tables, s.batch, s.fwd, s.bwd) for s in SERIES}
    assert not fit & held
    assert len({s.name for s in FIT_SERIES + SERIES}) == len(FIT_SERIES) + len(SERIES)
