"""The emulated-cluster bench's report: its RESULTS.md section and its plot, from the stored
JSON alone (``bench/cluster_bench.py`` measures and calls these; ``--render`` re-renders).

Per cell: samples/s and its ratio to 1D in the same run, eval AUC, bytes across hosts per
step, the cost model's predicted step and its error; then the verdicts the issue asks for
(2D against 1D and full replication, ``auto`` against the best fixed strategy).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from sparse2d.train.emulated_topology import link_bits


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render(result: dict[str, Any]) -> str:
    """One table per cluster and link: each strategy against 1D, best first."""
    groups: dict[tuple[int, int, str], list[dict[str, Any]]] = {}
    for cell in result["cells"]:
        groups.setdefault((cell["hosts"], cell["nproc"], cell["link"]), []).append(cell)
    lines = [
        "## Emulated cluster: 2D vs 1D vs full replication by link rate (bench/cluster_bench.py)",
        "",
        f"`{result['config']}`, {result['steps']} steps a run, {result['rounds']} rounds in "
        f"alternating order{', overrides ' + ' '.join(result['overrides']) if result['overrides'] else ''}; "
        f"{result['machine']}. samples/s: mean over the rounds (each the trainer's own); "
        "x1D: ratio to 1D's mean in the same run; bytes: what crossed host links per step, "
        "summed over hosts, from the interfaces' counters; emb/rank: the share of the tables "
        "each rank holds (1/L)."
        + (f" {result['predicted']}" if result.get("predicted") else "")
        + (f" Config: {result['relabelled']}." if result.get("relabelled") else "")
        + (f"\n\n{result['note']}" if result.get("note") else ""),
        "",
    ]
    for (hosts, nproc, link), cells in groups.items():

        def mean(cell: dict[str, Any], key: str) -> float | None:
            values = [r[key] for r in cell["runs"] if r.get(key) is not None]
            return statistics.fmean(values) if values else None

        base = next((mean(c, "samples_per_s") for c in cells if c["label"] == "1D"), None)
        lines += [
            f"**{hosts} hosts x {nproc} ranks, links {link}**",
            "",
            "| strategy | samples/s | rounds | x1D | eval AUC | MB crossing hosts / step "
            "| emb/rank | step ms measured / predicted |",
            "|---|---:|---|---:|---:|---:|---:|---:|",
        ]
        ranked = sorted(cells, key=lambda c: -(mean(c, "samples_per_s") or 0.0))
        for cell in ranked:
            sps = mean(cell, "samples_per_s")
            rounds = ", ".join(
                _fmt(r.get("samples_per_s"), ".0f") if "error" not in r else "failed"
                for r in cell["runs"]
            )
            ratio = sps / base if sps and base else None
            nbytes = mean(cell, "host_link_bytes_per_step")
            label = cell["label"]
            picked = {(r.get("sharding_group_size"), r.get("replica_layout")) for r in cell["runs"]}
            if cell["strategy"].get("auto"):
                label += ": " + ", ".join(f"L={g} {lay}" for g, lay in sorted(picked, key=str))
            step, predicted = mean(cell, "step_s"), mean(cell, "predicted_step_s")
            lines.append(
                f"| {label} | {_fmt(sps, '.0f')} | {rounds} | {_fmt(ratio, '.2f')} | "
                f"{_fmt(mean(cell, 'eval_auc'), '.4f')} | "
                f"{_fmt(None if nbytes is None else nbytes / 1e6, '.3f')} | "
                f"1/{next(iter(picked))[0] if picked else '?'} | "
                f"{_fmt(None if step is None else step * 1e3, '.0f')} / "
                f"{_fmt(None if predicted is None else predicted * 1e3, '.0f')} |"
            )
        lines += [""] + _verdicts(cells, mean)
        errors = [(c["label"], r["error"]) for c in cells for r in c["runs"] if "error" in r]
        lines += [f"- {label} failed: {error}" for label, error in errors[:5]] + [""]
    return "\n".join(lines)


def _verdicts(cells: list[dict[str, Any]], mean: Any) -> list[str]:
    """The advisor's picks against the best fixed strategy measured, and the cost model's
    error over the fixed strategies (mean absolute error of the step time, relative)."""
    fixed = [c for c in cells if not c["strategy"].get("auto") and mean(c, "samples_per_s")]
    out = []
    if fixed:
        best = max(fixed, key=lambda c: mean(c, "samples_per_s"))
        for cell in cells:
            sps = mean(cell, "samples_per_s")
            if cell["strategy"].get("auto") and sps:
                regret = mean(best, "samples_per_s") / sps
                out.append(
                    f"- {cell['label']}: the best fixed strategy ({best['label']}) is "
                    f"{regret:.2f}x its samples/s."
                )
    errors = [
        abs(mean(c, "predicted_step_s") - mean(c, "step_s")) / mean(c, "step_s")
        for c in fixed
        if mean(c, "predicted_step_s") is not None
    ]
    if errors:
        out.append(
            f"- Cost model: mean absolute error of the predicted step {statistics.fmean(errors):.0%}"
            f" over {len(errors)} fixed strategies (worst {max(errors):.0%})."
        )
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    """samples/s against link rate, one line per strategy, one panel per cluster shape."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = sorted({(c["hosts"], c["nproc"]) for c in result["cells"]})
    fig, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 4.5), squeeze=False)
    for ax, (hosts, nproc) in zip(axes[0], shapes):
        lines: dict[str, list[tuple[float, float]]] = {}
        for cell in result["cells"]:
            if (cell["hosts"], cell["nproc"]) != (hosts, nproc):
                continue
            values = [r["samples_per_s"] for r in cell["runs"] if "samples_per_s" in r]
            if values:
                link = cell["link"]  # "none": unshaped, no rate to plot at
                rate = float("nan") if link == "none" else float(link_bits(link))
                lines.setdefault(cell["label"], []).append((rate, statistics.fmean(values)))
        for label, points in sorted(lines.items()):
            points.sort()
            style = "-" if label in ("1D",) or label.startswith("L=1 ") else "--"
            ax.plot(
                [p[0] / 1e6 for p in points],
                [p[1] for p in points],
                style,
                marker="o",
                label=label,
                linewidth=2.5 if label == "1D" else 1.2,
            )
        ax.set_xscale("log")
        ax.set_ylim(bottom=0)
        ax.set_xlabel("host link rate (Mbit/s)")
        ax.set_ylabel("samples/s")
        ax.set_title(f"{hosts} hosts x {nproc} ranks")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
