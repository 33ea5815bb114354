"""bench/planner_fit.py: the fit reads the model's own coefficients, so on times the model
itself produced it must return the constants that produced them; verdicts by hand."""

from __future__ import annotations

import dataclasses

import pytest

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
import planner_fit as pf
from planner_holdout import FIT_SERIES, SERIES

from sparse2d.advisor.topology import PRESETS


def _points(truth) -> list[pf.Point]:
    points = []
    for s in FIT_SERIES:
        topo = PRESETS["cpu_gloo"].with_world_size(s.world)
        for L in [d for d in (1, 2, 4, 8) if s.world % d == 0]:
            points.append(pf.Point(pf.series_workload(s, L), topo, L, {}))
    for p in points:  # "measure" with the true constants
        c = p.predict(dataclasses.replace(truth, world_size=p.topology.world_size))
        p.measured = {"sync": c.sync_s, "step": c.step_s}
    return points


def test_fit_recovers_the_constants_that_made_the_times() -> None:
    truth = dataclasses.replace(
        PRESETS["cpu_gloo"],
        intra_host_bw=4e8,
        inter_host_bw=4e8,
        intra_host_latency_s=1e-3,
        inter_host_latency_s=1e-3,
        a2a_bw_factor=0.3,
        lookup_bw=9e8,
        step_overhead_s=0.01,
        sync_overhead_s=0.004,
        a2a_value_s=3e-8,
    )
    fitted = pf.fit(_points(truth), PRESETS["cpu_gloo"])  # row_update_s: measured, kept
    for key in (
        "intra_host_bw",
        "intra_host_latency_s",
        "a2a_bw_factor",
        "sync_overhead_s",
        "a2a_value_s",
    ):
        assert getattr(fitted, key) == pytest.approx(getattr(truth, key), rel=1e-3), key
    assert fitted.lookup_bw == pytest.approx(truth.lookup_bw, rel=0.05)
    assert fitted.step_overhead_s == pytest.approx(truth.step_overhead_s, rel=0.05)


def test_verdict_regret_and_rank_correlation_by_hand() -> None:
    class P:
        def __init__(self, L: int, pred: float, meas: float) -> None:
            self.L, self.measured, self._pred = L, {"step": meas}, pred

        def predict(self, topo):
            return dataclasses.make_dataclass("C", ["step_s"])(self._pred)

    points = [P(1, 3.0, 1.0), P(2, 2.0, 2.0), P(4, 1.0, 1.2)]
    v = pf.series_verdict(points, lambda p: None)  # type: ignore[arg-type]
    assert (v["pick"], v["best"]) == (4, 1)
    assert v["regret"] == pytest.approx(1.2)
    assert v["spearman"] == pytest.approx(-0.5)


def test_held_out_series_differ_from_the_fit_set() -> None:
    fit_keys = {(s.tables, s.batch) for s in FIT_SERIES}
    assert not any((s.tables, s.batch) in fit_keys for s in SERIES)
    types = {t for s in SERIES for _, _, _, t in s.tables}
    assert {"row_wise", "table_row_wise", "grid_shard"} <= types
    assert any(s.fwd != "fp32" for s in SERIES) and any(s.node for s in SERIES)
    assert sum(len([d for d in (1, 2, 4, 8) if s.world % d == 0]) for s in SERIES) >= 24
