"""Fit ``cpu_gloo`` on the fit set and judge the advisor on held-out series it never saw.

The cost model is linear in its machine constants: ``1/bandwidth`` of the all-reduce and of
the all-to-all, per-message latency, CPU time per pooled value moved, ``1/lookup_bw``, the
per-step and per-sync fixed costs (``row_update_s`` is measured on its own by
``lookup_cost.py``). Each term's coefficient is read off the model itself by evaluating it
on *unit* topologies (bandwidth 1 and no latency gives the bytes; latency 1 and infinite
bandwidth gives the message count), so the fit uses exactly the formulas the advisor uses
(ranks per core included), with nothing re-derived here.

Fit set: ``planner_fit_set*.json`` (``planner_holdout.FIT_SERIES``: 8 tables of dim 32,
table-wise fp32 and fp16 and row-wise, worlds 4 and 8; three runs, each point's mean, read by
``planner_calibration``). Held-out runs:
``planner_holdout*.json`` (row-wise, TWRW, grid with ``node_group_size``, fp16/bf16 qcomms,
other sizes and batches). Per held-out series: Spearman of step time over ``L`` and the
regret of the advisor's pick (measured step of the predicted-fastest ``L`` / measured best).
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

import numpy as np

NOISE_S = 0.005
"""Timing noise floor on the shared 2-core machine (seconds)."""
HUGE = 1e30


def _spearman(a: list[float], b: list[float]) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1]) if len(a) > 1 else 1.0


def _unit(
    base: Any, *, bw: float, alpha: float, lookup: float, row: float = 0.0, value: float = 0.0
) -> Any:
    return dataclasses.replace(
        base,
        intra_host_bw=bw,
        inter_host_bw=bw,
        intra_host_latency_s=alpha,
        inter_host_latency_s=alpha,
        lookup_bw=lookup,
        row_update_s=row,
        step_overhead_s=0.0,
        sync_overhead_s=0.0,
        a2a_bw_factor=1.0,
        a2a_value_s=value,
        scatter_bw_factor=1.0,
    )


class Point:
    """One measured (workload, world, L) and the model's coefficients for it."""

    def __init__(self, workload: Any, topology: Any, L: int, measured: dict[str, float]) -> None:
        from sparse2d.advisor import cost_terms as ct
        from sparse2d.advisor.cost_model import AnalyticCostModel
        from sparse2d.advisor.search import default_planner

        self.workload, self.topology, self.L, self.measured = workload, topology, L, measured
        planner = default_planner()

        def est(topo: Any) -> Any:
            return AnalyticCostModel(workload, topo, planner).estimate(L)

        by_bytes = est(_unit(topology, bw=1.0, alpha=0.0, lookup=HUGE))
        half_scatter = dataclasses.replace(
            _unit(topology, bw=1.0, alpha=0.0, lookup=HUGE), scatter_bw_factor=0.5
        )
        scatter = est(half_scatter).a2a_s - by_bytes.a2a_s  # the reduce-scatter's bytes
        by_msgs = est(_unit(topology, bw=HUGE, alpha=1.0, lookup=HUGE))
        by_lookup = est(_unit(topology, bw=HUGE, alpha=0.0, lookup=1.0))
        by_rows = est(_unit(topology, bw=HUGE, alpha=0.0, lookup=HUGE, row=1.0))
        by_values = est(_unit(topology, bw=HUGE, alpha=0.0, lookup=HUGE, value=1.0))
        self.a2a = (by_bytes.a2a_s - scatter, by_msgs.a2a_s, by_values.a2a_s, scatter)
        self.sync = (by_bytes.sync_s, by_msgs.sync_s, 1.0 if by_bytes.num_replicas > 1 else 0.0)
        self.lookup = by_lookup.compute_s
        self.rows = by_rows.compute_s
        self.share = ct.cpu_share(topology)  # the coefficients above already carry it
        self.types = by_bytes.sharding_types

    def predict(self, topo: Any) -> Any:
        from sparse2d.advisor.cost_model import AnalyticCostModel
        from sparse2d.advisor.search import default_planner

        return AnalyticCostModel(self.workload, topo, default_planner()).estimate(self.L)


def _nonnegative_lstsq(a: Any, b: Any) -> Any:
    """Least squares with every unknown >= 0: the best unconstrained solution over each
    subset of unknowns left free (at most 6 unknowns: 63 small solves)."""
    n = a.shape[1]
    best, best_err = np.zeros(n), float(np.sum(b**2))
    for mask in range(1, 2**n):
        cols = [i for i in range(n) if mask >> i & 1]
        x, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
        err = float(np.sum((a[:, cols] @ x - b) ** 2))
        if (x >= 0).all() and err < best_err:
            best, best_err = np.zeros(n), err
            best[cols] = x
    return best


def _series_key(p: Point) -> tuple[Any, ...]:
    """Points of one series share world, batch, qcomms and table shapes (not sharding
    types: the harness runs L=1 table-wise)."""
    w = p.workload
    shapes = tuple((t.rows, t.dim) for t in w.tables)
    return (p.topology.world_size, w.batch_size_per_rank, w.qcomm_forward, w.qcomm_backward, shapes)


def fit(points: list[Point], base: Any) -> Any:
    """Least squares (relative errors above the noise floor) of the six fitted constants.

    ``row_update_s`` is not fitted here: it is measured on its own (FBGEMM's kernels in one
    process, ``bench/lookup_cost.py``) and read from ``base``. The fit set's
    all-to-all is the forward+backward at ``L`` minus at L=1 of the same series, after taking
    out the row updates the model prices at each (fewer distinct rows per rank as ``L``
    grows); the lookup and fixed step costs are fitted on what the L=1 points leave.
    """
    row_s = base.row_update_s
    for p in points:
        p.measured.setdefault("fwdbwd", p.measured["step"] - p.measured["sync"])
    first = {_series_key(p): p for p in points if p.L == 1}  # no a2a at L=1
    rows, ys = [], []
    for p in points:  # all-reduce, all-to-all s/byte, s/message, s/sync, s/value, scatter
        if p.sync[2]:
            rows.append([p.sync[0], 0.0, p.sync[1], p.share, 0.0, 0.0])  # fixed x ranks/core
            ys.append(p.measured["sync"])
        base_point = first.get(_series_key(p))
        if p.L == 1 or base_point is None:
            continue
        a2a = p.measured["fwdbwd"] - p.rows * row_s
        a2a -= base_point.measured["fwdbwd"] - base_point.rows * row_s
        if a2a > NOISE_S:  # a difference of two noisy times
            rows.append([0.0, p.a2a[0], p.a2a[1], 0.0, p.a2a[2], p.a2a[3]])
            ys.append(a2a)
    weight = 1 / np.maximum(np.array(ys), NOISE_S)
    qcomms = len({(p.workload.qcomm_forward, p.workload.qcomm_backward) for p in points})
    # the per-value and reduce-scatter unknowns only where the fit set can tell them apart:
    # wire precisions that vary, and row-wise points
    free = [0, 1, 2, 3] + [4] * (qcomms > 1) + [5] * any(r[5] for r in rows)
    solution = np.zeros(6)
    solution[free] = _nonnegative_lstsq(
        np.array(rows)[:, free] * weight[:, None], np.array(ys) * weight
    )
    inv_bw, inv_a2a, alpha, sync_fixed, value_s, inv_scatter = (float(v) for v in solution)
    value_s = value_s if 4 in free else base.a2a_value_s
    inv_bw, alpha, sync_fixed = max(inv_bw, 1e-12), max(alpha, 0.0), max(sync_fixed, 0.0)
    factor = float(np.clip(inv_bw / max(inv_a2a, 1e-12), 0.01, 10.0))
    scatter_factor = base.scatter_bw_factor
    if 5 in free:
        scatter_factor = float(np.clip(inv_bw / max(inv_scatter, 1e-12), 0.01, 10.0))
    ones = [p for p in first.values()]
    x = np.array([p.lookup / p.share for p in ones])  # per unit of CPU share
    y = np.array([(p.measured["fwdbwd"] - p.rows * row_s) / p.share for p in ones])
    slope, overhead = np.polyfit(x, y, 1)
    if slope <= 0 or overhead < 0:  # keep the constants physical
        slope, overhead = float(np.mean(y)) / float(np.mean(x)), 0.0
    if slope <= 0:
        raise ValueError(
            f"row_update_s={row_s} prices more than the fit set's L=1 forward+backward "
            "times: measure it again (bench/lookup_cost.py)."
        )
    return dataclasses.replace(
        base,
        intra_host_bw=float(1 / inv_bw),
        inter_host_bw=float(1 / inv_bw),
        intra_host_latency_s=float(alpha),
        inter_host_latency_s=float(alpha),
        lookup_bw=float(1 / slope),
        step_overhead_s=float(overhead),
        sync_overhead_s=float(sync_fixed),
        a2a_bw_factor=factor,
        a2a_value_s=value_s,
        scatter_bw_factor=scatter_factor,
    )


def series_workload(series: Any, L: int) -> Any:
    """The advisor's view of one measured series at ``L``: its tables (table-wise at L=1, as
    the harness builds them), batch and qcomms; the harness draws ids uniformly (Zipf 0)."""
    from sparse2d.advisor.workload import TableLoad, Workload

    tables = tuple(
        TableLoad(n, r, d, 1, 2.0, t if L > 1 else "table_wise")
        for n, r, d, t in series.table_list()
    )
    return Workload(
        tables=tables,
        batch_size_per_rank=series.batch,
        qcomm_forward=series.fwd,
        qcomm_backward=series.bwd,
        zipf_exponent=0.0,
    )


def series_topology(series: Any, L: int) -> Any:
    """``cpu_gloo`` at the series' world. A ``node_group_size`` series pretends hosts of
    ``node`` ranks (TorchRec lays TWRW/grid out by host); the cores those ranks share are
    still the box's, so each pretend host gets its share of them."""
    from sparse2d.advisor.topology import PRESETS

    base = PRESETS["cpu_gloo"]
    if not series.node:
        return base.with_world_size(series.world)
    host = min(series.node, L)
    cores = base.cores_per_host * host / series.world
    return dataclasses.replace(
        base, world_size=series.world, ranks_per_host=host, cores_per_host=cores
    )


def holdout_points(saved: dict[str, Any]) -> dict[str, list[Point]]:
    """Held-out series -> points; the model sees each series' own types, node size, qcomms."""
    from planner_holdout import SERIES

    out: dict[str, list[Point]] = {}
    for s in SERIES:
        entry = saved.get(s.name)
        if entry is None or "points" not in entry:
            continue
        points = []
        for L_text, m in sorted(entry["points"].items(), key=lambda kv: int(kv[0])):
            L = int(L_text)
            topo = series_topology(s, L)
            points.append(Point(series_workload(s, L), topo, L, {"a2a": 0.0, **m}))
        out[s.name] = points
    return out


def series_verdict(points: list[Point], topo_for: Any) -> dict[str, Any]:
    """Spearman, the advisor's pick, the measured best and the regret of one series."""
    pred = [p.predict(topo_for(p)).step_s for p in points]
    meas = [p.measured["step"] for p in points]
    pick = points[int(np.argmin(pred))].L
    best = points[int(np.argmin(meas))].L
    regret = meas[int(np.argmin(pred))] / min(meas)
    return {
        "spearman": _spearman(pred, meas),
        "pick": pick,
        "best": best,
        "regret": regret,
        "pred": pred,
        "meas": meas,
    }


def summary(verdicts: dict[str, dict[str, Any]]) -> str:
    rhos = [v["spearman"] for v in verdicts.values()]
    regrets = [v["regret"] for v in verdicts.values()]
    return (
        f"{len(verdicts)} series: Spearman min {min(rhos):.2f}, median "
        f"{statistics.median(rhos):.2f}; regret max {max(regrets):.3f}, median "
        f"{statistics.median(regrets):.3f}"
    )
