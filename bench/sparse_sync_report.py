"""Tables and plots of ``bench/sparse_sync_bench.py`` (kept apart: the runner stays short)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sparse2d.sync.engines.sparse import DEFAULT_CROSSOVER

WORLD, L, DIM, BATCH, TABLES = 4, 2, 64, 512, 2
DISTS = ("uniform", "zipf")
"""The bench's shape (ranks, group size, table dim, batch per rank, tables) and id laws."""


def _paired(numerator: list[float], denominator: list[float]) -> float:
    """Median of per-step ratios (nan without data)."""
    ratios = sorted(a / b for a, b in zip(numerator, denominator, strict=False) if b > 0)
    return ratios[len(ratios) // 2] if ratios else float("nan")


def _crossover(sweep: list[dict[str, Any]]) -> float:
    """Touched fraction where the sparse sync gets as slow as the dense one (interpolated)."""
    prev = None
    for point in sweep:
        ratio = point["sparse_s"] / point["dense_s"]
        if ratio >= 1.0:
            if prev is None:
                return point["fraction"]
            f0, r0 = prev
            return f0 + (1.0 - r0) * (point["fraction"] - f0) / (ratio - r0)
        prev = (point["fraction"], ratio)
    return 1.0


def _summaries(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows_out = []
    for size in results:
        groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for run in size["runs"]:
            groups.setdefault((run["dist"], run["every"]), []).append(run)
        for (dist_name, every), runs in groups.items():
            med = {k: sorted(r[k] for r in runs)[len(runs) // 2] for k in runs[0] if k != "dist"}
            sparse_bytes = med["sparse_bytes"] + med["meta_bytes"]
            rows_out.append(
                dict(
                    rows=size["rows"],
                    dist=dist_name,
                    every=every,
                    union=med["union_fraction"],
                    step_ms=med["step_s"] * 1e3,
                    sparse_mb=sparse_bytes / 1e6,
                    dense_mb=med["dense_bytes"] / 1e6,
                    bytes_x=med["dense_bytes"] / max(sparse_bytes, 1),
                    sparse_ms=med["sparse_s"] * 1e3,
                    dense_ms=med["dense_s"] * 1e3,
                    time_x=med["dense_s"] / med["sparse_s"],
                    auto_ms=med["auto_s"] * 1e3,
                    auto_dense=sum(r["auto_dense"] for r in runs) / len(runs),
                    auto_x=med["auto_s"] / min(med["sparse_s"], med["dense_s"]),
                )
            )
    return rows_out


def _markdown(results: list[dict[str, Any]], args: argparse.Namespace, wall: float) -> str:
    lines = [
        "## Sparse replica sync (touched rows only) vs dense sync",
        "",
        f"`bench/sparse_sync_bench.py` — 4 gloo CPU processes ({args.machine}; ratios are "
        f"measured within one run), L=2 (2 replicas per shard), {TABLES} TW tables x {DIM} fp32, row-wise "
        f"Adagrad (weights + row state synced), batch {BATCH}/rank, 1 id/sample/table, median of "
        f"{args.reps} syncs per cell, slowest rank; sparse bytes include the union metadata "
        f"(counts, id lists or bitmaps). *Synced rows* = fraction of rows in the sparse payload "
        f"(1.0 = the engine fell back to dense at its crossover). *step ms* = one training step. "
        f"Wall time {wall:.0f} s.",
        "",
        "| rows/table | ids | sync_every | synced rows | sparse MB | dense MB | bytes x | step ms "
        "| sparse ms | dense ms | time x | auto ms | auto dense | auto / best |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in _summaries(results):
        lines.append(
            f"| {r['rows']:.0e} | {r['dist']} | {r['every']} | {r['union']:.4f} | "
            f"{r['sparse_mb']:.2f} | {r['dense_mb']:.1f} | {r['bytes_x']:.1f} | {r['step_ms']:.1f} | "
            f"{r['sparse_ms']:.1f} | {r['dense_ms']:.1f} | {r['time_x']:.1f} | "
            f"{r['auto_ms']:.1f} | {r['auto_dense']:.2f} | {r['auto_x']:.2f} |"
        )
    lines += ["", "Crossover sweep (never-dense sparse sync vs dense, union = fraction):", ""]
    lines += [
        "| rows/table | fraction | sparse ms | dense ms | sparse/dense |",
        "|---:|---:|---:|---:|---:|",
    ]
    for size in results:
        for p in size["sweep"]:
            lines.append(
                f"| {size['rows']:.0e} | {p['fraction']} | {p['sparse_s'] * 1e3:.1f} | "
                f"{p['dense_s'] * 1e3:.1f} | {p['sparse_s'] / p['dense_s']:.2f} |"
            )
    lines += [
        "",
        f"Auto vs the fixed engines, alternating: Zipf ids, sync every step, "
        f"{args.ab_reps} steps; each step times every engine, in all orders in turn, "
        f"plus a second touched-rows and a second dense engine (A/A controls: their "
        f"ratios to the first are the measurement's own noise and bias, the floor under "
        f"any auto / best figure). Slowest rank per sync; auto keeps what "
        f"it learnt in the cells above, as in a long run. *Paired* = median over steps of "
        f"the per-step ratio (load hits both alike). This is the acceptance check of "
        f"`auto` (goal <= 1.05):",
        "",
        "| rows/table | sparse ms | dense ms | auto ms | auto / best (medians) "
        "| auto / best (paired) | A/A sparse (medians, paired) "
        "| A/A dense (medians, paired) | auto dense syncs |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    nan = float("nan")
    for size in results:
        ab = size.get("ab")
        if ab and ab["auto"]:
            med = {k: sorted(v)[len(v) // 2] for k, v in ab.items()}
            best = "sparse" if med["sparse"] <= med["dense"] else "dense"
            lines.append(
                f"| {size['rows']:.0e} | {med['sparse'] * 1e3:.1f} | {med['dense'] * 1e3:.1f} | "
                f"{med['auto'] * 1e3:.1f} | {med['auto'] / med[best]:.2f} | "
                f"{_paired(ab['auto'], ab[best]):.2f} | "
                f"{med.get('twin', nan) / med['sparse']:.2f}, "
                f"{_paired(ab.get('twin', []), ab['sparse']):.2f} | "
                f"{med.get('dense_twin', nan) / med['dense']:.2f}, "
                f"{_paired(ab.get('dense_twin', []), ab['dense']):.2f} | "
                f"{sum(ab['auto_dense']):.0f} / {len(ab['auto_dense'])} |"
            )
    crossovers = ", ".join(f"{s['rows']:.0e} rows: {_crossover(s['sweep']):.2f}" for s in results)
    lines += [
        "",
        f"Measured crossover (sparse time = dense time): {crossovers}. The engine's default "
        f"`DEFAULT_CROSSOVER` = {DEFAULT_CROSSOVER} (a shard whose replica union exceeds it is "
        f"synced densely) was used for the *sparse* columns of the first table. *auto* = "
        f'`engine="auto"` (`sparse2d/sync/engines/auto.py`): per sync the cheaper of dense and '
        f"touched rows by the cost model probed at start-up, corrected per mode by its timed "
        f"syncs; *auto dense* = fraction of its measured syncs that ran dense; *auto / best* = "
        f"its median time over the better of the sparse and dense medians. With {args.reps} "
        f"syncs per cell, a cell shows auto while it learns a changed workload (the cells "
        f"change sync interval and id distribution); the alternating table below is steady.",
    ]
    return "\n".join(lines)


def _plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bytes_ax, left, right) = plt.subplots(1, 3, figsize=(17, 4.5))
    summaries = _summaries(results)
    for rows in sorted({r["rows"] for r in summaries}):
        for dist_name, marker in zip(DISTS, ("o", "s"), strict=True):
            cells = [r for r in summaries if r["rows"] == rows and r["dist"] == dist_name]
            everys = [r["every"] for r in cells]
            label = f"{rows:.0e} rows, {dist_name}"
            left.plot(
                everys, [r["sparse_ms"] for r in cells], marker=marker, label=f"sparse {label}"
            )
            bytes_ax.plot(
                everys, [r["sparse_mb"] for r in cells], marker=marker, label=f"sparse {label}"
            )
        dense_mb = [r["dense_mb"] for r in summaries if r["rows"] == rows]
        bytes_ax.axhline(dense_mb[0], linestyle="--", color="gray")
        bytes_ax.text(1, dense_mb[0] * 1.15, f"dense {rows:.0e}", color="gray")
        dense = [r["dense_ms"] for r in summaries if r["rows"] == rows]
        left.axhline(sorted(dense)[len(dense) // 2], linestyle="--", color="gray")
        left.text(1, sorted(dense)[len(dense) // 2] * 1.1, f"dense {rows:.0e}", color="gray")
    left.set(
        xscale="log",
        yscale="log",
        xlabel="sync_every (steps)",
        ylabel="sync time (ms)",
        title="Sync time per sync (2 replicas, 4 gloo ranks)",
    )
    left.legend(fontsize=7)
    bytes_ax.set(
        xscale="log",
        yscale="log",
        xlabel="sync_every (steps)",
        ylabel="MB sent per rank per sync",
        title="Bytes per sync (dashed: dense)",
    )
    bytes_ax.legend(fontsize=7)
    for size in results:
        fractions = [p["fraction"] for p in size["sweep"]]
        ratio = [p["sparse_s"] / p["dense_s"] for p in size["sweep"]]
        right.plot(fractions, ratio, marker="o", label=f"{size['rows']:.0e} rows")
    right.axhline(1.0, linestyle="--", color="gray")
    right.set(
        xscale="log",
        xlabel="touched fraction (union)",
        ylabel="sparse time / dense time",
        title="Crossover: sparse sync vs dense sync",
    )
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
