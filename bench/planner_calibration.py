"""Calibrate the group-size advisor on this machine and judge it on held-out runs.

Fit set (``planner_fit_set.json``): 8 table-wise fp32 tables of dim 32 in two workloads
(20,000 rows x 256 samples per rank: sync-heavy; 2,000 rows x 2,048: all-to-all-heavy), worlds
4 and 8, every divisor L: 14 points. The ``cpu_gloo`` constants (all-reduce and all-to-all
bandwidth, message latency, lookup bandwidth, per-step and per-sync fixed costs) are fitted
on these alone (``planner_fit.fit``).

Held-out set (``planner_holdout.json``, ``--holdout``): series the fit never sees (row-wise,
table-row-wise and grid with ``node_group_size``, fp16/bf16 qcomms, other sizes and batches,
the small-tables/large-batch case), each judged by the Spearman rank correlation of step
time over L and the regret of the advisor's pick (measured step of the predicted-fastest L
over the measured best). Both sets are measured by ``planner_holdout.py`` (alternating L
within one run, loads recorded).

Usage: ``.venv/bin/python bench/planner_calibration.py [--measure] [--holdout] [--no-write]``
(``--measure`` re-measures both sets first: ~20 minutes on the shared 2-core box).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from bench_util import write_section  # noqa: E402


def _load(kind: str) -> dict[str, Any]:
    from planner_holdout import SAVED

    with open(SAVED[kind]) as f:
        return json.load(f)


def _with_a2a(saved: dict[str, Any]) -> dict[str, Any]:
    """a2a measured = forward+backward at L minus at L=1 (same series, same run)."""
    for entry in saved.values():
        pts = entry.get("points", {})
        base = pts.get("1", {}).get("fwdbwd", 0.0)
        for p in pts.values():
            p["a2a"] = max(0.0, p["fwdbwd"] - base)
    return saved


def _fit_series(saved: dict[str, Any]) -> dict[str, list[Any]]:
    from planner_fit import Point
    from planner_holdout import FIT_SERIES

    from sparse2d.planner.topology import PRESETS
    from sparse2d.planner.workload import TableLoad, Workload

    out = {}
    for s in FIT_SERIES:
        entry = saved.get(s.name, {})
        pts = []
        for L_text, m in sorted(entry.get("points", {}).items(), key=lambda kv: int(kv[0])):
            tables = tuple(TableLoad(n, r, d, 1, 2.0, t) for n, r, d, t in s.table_list())
            w = Workload(tables=tables, batch_size_per_rank=s.batch)
            pts.append(Point(w, PRESETS["cpu_gloo"].with_world_size(s.world), int(L_text), m))
        out[s.name] = pts
    return out


def _table(name: str, points: list[Any], verdict: dict[str, Any], load: Any) -> list[str]:
    rows = []
    for p, pred, meas in zip(points, verdict["pred"], verdict["meas"]):
        types = " ".join(f"{t}:{n}" for t, n in p.types)
        mark = " pick" if p.L == verdict["pick"] else ""
        mark += " best" if p.L == verdict["best"] else ""
        rows.append(
            f"| {name} | {p.topology.world_size} | {p.L} | {types} | {meas * 1e3:.1f} | "
            f"{pred * 1e3:.1f} |{mark} |"
        )
    loads = f"{load[0]:.1f} -> {load[1]:.1f}" if load else "-"
    rows.append(
        f"| **{name}** | | | load {loads} | Spearman **{verdict['spearman']:.2f}** | "
        f"regret **{verdict['regret']:.3f}** | |"
    )
    return rows


HEADER = [
    "| series | world | L | sharding (tables) | measured step ms | predicted ms | |",
    "|---|---:|---:|---|---:|---:|---|",
]


def report(holdout: bool) -> str:
    import planner_fit as pf

    from sparse2d.planner.topology import PRESETS

    fit_saved = _with_a2a(_load("fit"))
    fit_set = _fit_series(fit_saved)
    fitted = pf.fit([p for pts in fit_set.values() for p in pts], PRESETS["cpu_gloo"])

    def topo_for(p: Any) -> Any:
        return dataclasses.replace(
            fitted, world_size=p.topology.world_size, ranks_per_host=p.topology.ranks_per_host
        )

    lines = ["### Fit set (the constants are fitted on these points)", "", *HEADER]
    fit_v = {}
    for name, pts in fit_set.items():
        fit_v[name] = pf.series_verdict(pts, topo_for)
        lines += _table(name, pts, fit_v[name], fit_saved[name].get("load"))
    lines += ["", f"- fit set: {pf.summary(fit_v)}."]
    lines.append(
        f"- fitted `cpu_gloo`: all-reduce bandwidth {fitted.intra_host_bw / 1e9:.3f} GB/s, "
        f"all-to-all factor {fitted.a2a_bw_factor:.2f}, latency "
        f"{fitted.intra_host_latency_s * 1e6:.0f} us/message, lookup bandwidth "
        f"{fitted.lookup_bw / 1e9:.3f} GB/s, step overhead {fitted.step_overhead_s * 1e3:.1f} "
        f"ms, sync overhead {fitted.sync_overhead_s * 1e3:.1f} ms."
    )
    if holdout:
        saved = _with_a2a(_load("holdout"))
        lines += ["", "### Held-out set (never used by the fit)", "", *HEADER]
        verdicts = {}
        for name, pts in pf.holdout_points(saved).items():
            verdicts[name] = pf.series_verdict(pts, topo_for)
            lines += _table(name, pts, verdicts[name], saved[name].get("load"))
        failed = [n for n, e in saved.items() if "error" in e]
        rhos = [round(v["spearman"], 6) for v in verdicts.values()]
        regrets = [v["regret"] for v in verdicts.values()]
        npoints = sum(len(v["meas"]) for v in verdicts.values())
        lines += [
            "",
            f"- held-out: {npoints} points, {pf.summary(verdicts)}.",
            f"- acceptance (Spearman >= 0.8 on every series): "
            f"{'holds' if min(rhos) >= 0.8 else 'FAILS on ' + str([n for n, v in verdicts.items() if round(v['spearman'], 6) < 0.8])}; "
            f"(regret <= 1.10 every series, median <= 1.03): "
            f"{'holds' if max(regrets) <= 1.10 and statistics.median(regrets) <= 1.03 else 'FAILS on ' + str([n for n, v in verdicts.items() if v['regret'] > 1.10])}.",
        ]  # fmt: skip
        if failed:
            lines.append(f"- series that failed to run: {failed}")
        lines += _repeat(saved, verdicts, topo_for)
        lines += ["", *_main_job(fitted)]
    return "\n".join(lines)


def _repeat(saved: dict[str, Any], first: dict[str, Any], topo_for: Any) -> list[str]:
    """Series measured again (``repeat``, ``run3``): each run alone, and all runs pooled
    (mean step per L)."""
    import planner_fit as pf
    from planner_holdout import SAVED

    later = [_with_a2a(_load(k)) for k in ("repeat", "run3") if os.path.exists(SAVED[k])]
    if not later:
        return []
    rows = [
        "",
        "Noise check: series measured again later (`planner_holdout.py repeat` and "
        "`planner_holdout.py run3`, the same harness); each run alone and all runs pooled "
        "(mean step per L):",
        "",
        "| series | ms by L, run 1 / 2 / ... | Spearman per run / pooled | regret per run / "
        "pooled |",
        "|---|---|---|---|",
    ]
    pooled = {}
    for name in first:
        runs = [saved] + [r for r in later if "points" in r.get(name, {})]
        if len(runs) < 2:
            continue
        verdicts = [
            pf.series_verdict(pf.holdout_points({name: r[name]})[name], topo_for) for r in runs
        ]
        pts = pf.holdout_points({name: saved[name]})[name]
        for p in pts:
            steps = [r[name]["points"][str(p.L)]["step"] for r in runs]
            p.measured = {**p.measured, "step": sum(steps) / len(steps)}
        pooled[name] = vp = pf.series_verdict(pts, topo_for)
        ms = " / ".join(", ".join(f"{m * 1e3:.0f}" for m in v["meas"]) for v in verdicts)
        rho = " / ".join(f"{v['spearman']:.2f}" for v in verdicts)
        regret = " / ".join(f"{v['regret']:.3f}" for v in verdicts)
        rows.append(
            f"| {name} | {ms} | {rho} / **{vp['spearman']:.2f}** | {regret} / "
            f"**{vp['regret']:.3f}** |"
        )
    merged = {**first, **pooled}
    regrets = [v["regret"] for v in merged.values()]
    rows += [
        "",
        f"- held-out with every measured run pooled: {pf.summary(merged)}; regret <= 1.10 on "
        f"every series: {'holds' if max(regrets) <= 1.10 else 'FAILS'}, median <= 1.03: "
        f"{'holds' if statistics.median(regrets) <= 1.03 else 'FAILS'}.",
    ]
    return rows


def _main_job(fitted: Any) -> list[str]:
    """The shipped main job (trainer, DDP, folded sync) at every L vs the advisor."""
    import planner_fit as pf
    from planner_main_job import SAVED

    from sparse2d.train.config import load_config
    from sparse2d.train.plan import workload_from_config

    if not os.path.exists(SAVED):
        return ["- main job: not measured (run `bench/planner_main_job.py`)."]
    with open(SAVED) as f:
        saved = json.load(f)
    cfg = load_config(os.path.join(os.path.dirname(HERE), "configs", "tiny_cpu.yaml"))
    workload, world = workload_from_config(cfg), 4
    topo = dataclasses.replace(fitted, world_size=world)
    samples = world * cfg.data.batch_size_per_rank
    points = [
        pf.Point(workload, topo, int(L), {"step": samples / statistics.median(rates)})
        for L, rates in sorted(saved["samples_per_s"].items(), key=lambda kv: int(kv[0]))
    ]
    v = pf.series_verdict(points, lambda p: p.topology)
    rows = [
        "### The shipped main job (`configs/tiny_cpu.yaml`, world 4, trainer with DDP)",
        "",
        "| L | samples/s per round | measured step ms (median) | predicted ms | sync |",
        "|---:|---|---:|---:|---|",
    ]
    for p, pred, meas in zip(points, v["pred"], v["meas"]):
        rates = ", ".join(f"{r:.0f}" for r in saved["samples_per_s"][str(p.L)])
        kind = p.predict(p.topology).sync_kind
        rows.append(f"| {p.L} | {rates} | {meas * 1e3:.1f} | {pred * 1e3:.1f} | {kind} |")
    rows += [
        "",
        f"- {saved['steps']} steps per run, L alternating, load {saved['load'][0]:.1f} -> "
        f"{saved['load'][1]:.1f}; Spearman {v['spearman']:.2f}, pick L={v['pick']}, measured "
        f"best L={v['best']}, regret {v['regret']:.3f}.",
    ]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", action="store_true", help="re-measure fit and held-out")
    parser.add_argument("--holdout", action="store_true", help="report on the held-out set")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    if args.measure:
        from planner_holdout import measure_all

        measure_all("fit", args.rounds, args.steps)
        if args.holdout:
            measure_all("holdout", args.rounds, args.steps)
    text = report(args.holdout)
    print(text)
    if not args.no_write:
        header = (
            "## Group-size advisor: calibration, fit vs held-out (bench/planner_calibration.py)\n\n"
            "Command: `PYTHONPATH=. .venv/bin/python bench/planner_calibration.py --holdout` "
            "(reads `bench/planner_fit_set.json` and `bench/planner_holdout.json`; `--measure` "
            "re-measures both with `bench/planner_holdout.py`). gloo CPU processes on the shared "
            "2-core box; every series alternates its L within one run (3 rounds x 2 steps per L "
            "after a warm-up round), median step, slowest rank; load = 1-minute load average "
            "before -> after the series. Tables of rows x dim with 1-3 ids per bag (mean 2), "
            "row-wise AdaGrad, dense sync after every step; L=1 runs every table table-wise.\n\n"
        )
        write_section(header + text, "planner-holdout")
    return 0


if __name__ == "__main__":
    sys.exit(main())
