"""Fit ``cpu_gloo`` on the fit set and judge the advisor on held-out series it never saw.

The cost model is linear in five machine constants: ``1/bandwidth``, per-message latency,
``1/lookup_bw``, the per-step and per-sync fixed costs. Each term's coefficient is read off
the model itself by evaluating it on *unit* topologies (bandwidth 1 and no latency gives
the bytes; latency 1 and infinite bandwidth gives the message count), so the fit uses
exactly the formulas the advisor uses, with nothing re-derived here.

Fit set: ``planner_calibration.json`` (8 table-wise fp32 tables, worlds 4 and 8).
Held-out set: ``planner_holdout.json`` (``planner_holdout.py``: row-wise, TWRW, grid with
``node_group_size``, fp16/bf16 qcomms, other sizes and batches). Per held-out series:
Spearman of step time over ``L`` and the regret of the advisor's pick (measured step of
the predicted-fastest ``L`` / measured best).
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


def _unit(base: Any, *, bw: float, alpha: float, lookup: float) -> Any:
    return dataclasses.replace(
        base, intra_host_bw=bw, inter_host_bw=bw, intra_host_latency_s=alpha,
        inter_host_latency_s=alpha, lookup_bw=lookup, step_overhead_s=0.0, sync_overhead_s=0.0,
        a2a_bw_factor=1.0,
    )  # fmt: skip


class Point:
    """One measured (workload, world, L) and the model's coefficients for it."""

    def __init__(self, workload: Any, topology: Any, L: int, measured: dict[str, float]) -> None:
        from sparse2d.planner.cost_model import AnalyticCostModel
        from sparse2d.planner.search import default_planner

        self.workload, self.topology, self.L, self.measured = workload, topology, L, measured
        planner = default_planner()

        def est(topo: Any) -> Any:
            return AnalyticCostModel(workload, topo, planner).estimate(L)

        by_bytes = est(_unit(topology, bw=1.0, alpha=0.0, lookup=HUGE))
        by_msgs = est(_unit(topology, bw=HUGE, alpha=1.0, lookup=HUGE))
        by_lookup = est(_unit(topology, bw=HUGE, alpha=0.0, lookup=1.0))
        self.a2a = (by_bytes.a2a_s, by_msgs.a2a_s)
        self.sync = (by_bytes.sync_s, by_msgs.sync_s, 1.0 if by_bytes.num_replicas > 1 else 0.0)
        self.lookup = by_lookup.compute_s
        self.types = by_bytes.sharding_types

    def predict(self, topo: Any) -> Any:
        from sparse2d.planner.cost_model import AnalyticCostModel
        from sparse2d.planner.search import default_planner

        return AnalyticCostModel(self.workload, topo, default_planner()).estimate(self.L)


def fit(points: list[Point], base: Any) -> Any:
    """Least squares (relative errors above the noise floor) of the five constants."""
    rows, ys = [], []
    for p in points:  # columns: all-reduce s/byte, all-to-all s/byte, s/message, s/sync
        if p.sync[2]:
            rows.append([p.sync[0], 0.0, p.sync[1], 1.0])
            ys.append(p.measured["sync"])
        if p.L > 1 and p.measured["a2a"] > NOISE_S:  # a difference of two noisy times
            rows.append([0.0, p.a2a[0], p.a2a[1], 0.0])
            ys.append(p.measured["a2a"])
    weight = 1 / np.maximum(np.array(ys), NOISE_S)
    (inv_bw, inv_a2a, alpha, sync_fixed), *_ = np.linalg.lstsq(
        np.array(rows) * weight[:, None], np.array(ys) * weight, rcond=None
    )
    inv_bw, alpha, sync_fixed = max(inv_bw, 1e-12), max(alpha, 0.0), max(sync_fixed, 0.0)
    factor = float(np.clip(inv_bw / max(inv_a2a, 1e-12), 0.01, 10.0))
    x = [p.lookup for p in points]
    y = [
        p.measured["step"] - p.measured["sync"] - p.measured["a2a"] for p in points
    ]  # lookups + fixed step cost
    slope, overhead = np.polyfit(x, y, 1)
    if slope <= 0 or overhead < 0:  # keep the constants physical
        slope, overhead = float(np.mean(y)) / float(np.mean(x)), 0.0
    return dataclasses.replace(
        base, intra_host_bw=float(1 / inv_bw), inter_host_bw=float(1 / inv_bw),
        intra_host_latency_s=float(alpha), inter_host_latency_s=float(alpha),
        lookup_bw=float(1 / slope), step_overhead_s=float(overhead),
        sync_overhead_s=float(sync_fixed), a2a_bw_factor=factor,
    )  # fmt: skip


def holdout_points(saved: dict[str, Any]) -> dict[str, list[Point]]:
    """Held-out series -> points; the model sees each series' own types, node size, qcomms."""
    from planner_holdout import SERIES

    from sparse2d.planner.topology import PRESETS
    from sparse2d.planner.workload import TableLoad, Workload

    out: dict[str, list[Point]] = {}
    for s in SERIES:
        entry = saved.get(s.name)
        if entry is None or "points" not in entry:
            continue
        points = []
        for L_text, m in sorted(entry["points"].items(), key=lambda kv: int(kv[0])):
            L = int(L_text)
            tables = tuple(
                TableLoad(n, r, d, 1, 2.0, t if L > 1 else "table_wise")
                for n, r, d, t in s.table_list()
            )
            w = Workload(
                tables=tables, batch_size_per_rank=s.batch, qcomm_forward=s.fwd,
                qcomm_backward=s.bwd,
            )  # fmt: skip
            host = min(s.node, L) if s.node else PRESETS["cpu_gloo"].ranks_per_host
            topo = dataclasses.replace(PRESETS["cpu_gloo"], world_size=s.world, ranks_per_host=host)
            points.append(Point(w, topo, L, {"a2a": 0.0, **m}))
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
        "spearman": _spearman(pred, meas), "pick": pick, "best": best, "regret": regret,
        "pred": pred, "meas": meas,
    }  # fmt: skip


def summary(verdicts: dict[str, dict[str, Any]]) -> str:
    rhos = [v["spearman"] for v in verdicts.values()]
    regrets = [v["regret"] for v in verdicts.values()]
    return (
        f"{len(verdicts)} series: Spearman min {min(rhos):.2f}, median "
        f"{statistics.median(rhos):.2f}; regret max {max(regrets):.3f}, median "
        f"{statistics.median(regrets):.3f}"
    )
