"""The emulated-cluster bench's report: its RESULTS.md section and its plot, from the stored
JSON alone (``bench/cluster_bench.py`` measures and calls these; ``--render`` re-renders).

Per cell: samples/s and its ratio to 1D in the same run (a run without 1D: to ``auto``, the
setting the options preset changes one option of), eval AUC, bytes across hosts per step, the
cost model's predicted step and its error; then the verdicts the issue asks for (2D against
1D and full replication, ``auto`` against the best fixed strategy). Rows of options retired
since (``sync.options.RETIRED``) are marked as the evidence of their retirement.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from sparse2d.sync.options import RETIRED
from sparse2d.train.emulated_topology import link_bits

TOPICS = {
    None: "2D vs 1D vs full replication by link rate",
    "main": "main job, 2D vs 1D vs full replication and auto",
    "main_every10": "main job, 2D vs 1D vs full replication and auto",
    "options": "sync options one at a time",
    "cadence": "sync cadence",
    "stream": "streamed vs burst sync, with the step's bounds",
}
"""What each preset's runs compare (``cluster_bench.PRESETS``): the first half of its title."""


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def stored_switch(strategy: dict[str, Any]) -> str:
    """The ``parallel.sync`` switch (``key=value``) of a stored strategy. Runs before the
    retirements wrote ``bf16: bool`` (``compression: bf16``) and a bare name for ``NAME=true``."""
    switch = strategy.get("switch", "")
    if strategy.get("bf16"):
        switch = "compression=bf16"
    return switch if not switch or "=" in switch else f"{switch}=true"


def retired_option(strategy: dict[str, Any]) -> str:
    """The retired option a stored strategy ran (``sync.options.RETIRED``), or ``""``."""
    key = stored_switch(strategy).split("=")[0]
    return key if key in RETIRED else ""


def title(result: dict[str, Any], preset: str | None = None) -> str:
    """The section's heading: what the runs compare, on which clusters, links and cadence,
    and the command that writes it (distinct for every preset's stored run)."""
    cells = result["cells"]
    shapes = sorted({(c["hosts"], c["nproc"]) for c in cells}, reverse=True)
    links = sorted({c["link"] for c in cells}, key=lambda x: link_bits(x) if x != "none" else 0)
    every = sorted({c["strategy"].get("every") for c in cells if c["label"] != "1D"} - {None})

    def both(items: list[str]) -> str:
        return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]

    command = "bench/cluster_bench.py" + (f" --preset {preset}" if preset else "")
    return (
        f"## Emulated cluster, {TOPICS.get(preset, TOPICS[None])}: "
        f"{both([f'{h} hosts x {n} ranks' for h, n in shapes])} at {both(links)}"
        + (f", sync every {both([str(n) for n in every])}" if every else "")
        + f" ({command})"
    )


def _mean(cell: dict[str, Any], key: str) -> float | None:
    values = [r[key] for r in cell["runs"] if r.get(key) is not None]
    return statistics.fmean(values) if values else None


def _baseline(cells: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What a group's ratios are taken against: 1D, or (a run without it, the options
    preset) the ``auto`` engine with no switch, the setting the others change one option of."""
    for cell in cells:
        if cell["label"] == "1D":
            return cell
    plain = [
        c
        for c in cells
        if c["strategy"].get("engine") == "auto" and not stored_switch(c["strategy"])
    ]
    return plain[0] if plain and not any(c["strategy"].get("auto") for c in cells) else None


def render(result: dict[str, Any], preset: str | None = None) -> str:
    """One table per cluster and link: each strategy against 1D (or ``_baseline``), best
    first; rows of retired options marked as the evidence of their retirement."""
    groups: dict[tuple[int, int, str], list[dict[str, Any]]] = {}
    for cell in result["cells"]:
        groups.setdefault((cell["hosts"], cell["nproc"], cell["link"]), []).append(cell)
    bases = {key: _baseline(cells) for key, cells in groups.items()}
    base_names = sorted({b["label"] for b in bases.values() if b is not None})
    ratio_note = " or ".join(f"{name}'s" for name in base_names) or "1D's"
    lines = [
        title(result, preset),
        "",
        f"`{result['config']}`, {result['steps']} steps a run, {result['rounds']} rounds in "
        f"alternating order{', overrides ' + ' '.join(result['overrides']) if result['overrides'] else ''}; "
        f"{result['machine']}. samples/s: mean over the rounds (each the trainer's own); "
        f"x base: ratio to {ratio_note} mean in the same run and link; bytes: what crossed "
        "host links per step, summed over hosts, from the interfaces' counters; emb/rank: "
        "the share of the tables each rank holds (1/L)."
        + (f" {result['predicted']}" if result.get("predicted") else "")
        + (f" Config: {result['relabelled']}." if result.get("relabelled") else ""),
        "",
    ]
    retired_rows = False
    for key, cells in groups.items():
        hosts, nproc, link = key
        base_cell = bases[key]
        base = _mean(base_cell, "samples_per_s") if base_cell else None
        lines += [
            f"**{hosts} hosts x {nproc} ranks, links {link}**"
            + (f" (base: {base_cell['label']})" if base_cell else ""),
            "",
            "| strategy | samples/s | rounds | x base | eval AUC | MB crossing hosts / step "
            "| emb/rank | step ms measured / predicted |",
            "|---|---:|---|---:|---:|---:|---:|---:|",
        ]
        ranked = sorted(cells, key=lambda c: -(_mean(c, "samples_per_s") or 0.0))
        for cell in ranked:
            sps = _mean(cell, "samples_per_s")
            rounds = ", ".join(
                _fmt(r.get("samples_per_s"), ".0f") if "error" not in r else "failed"
                for r in cell["runs"]
            )
            ratio = sps / base if sps and base else None
            nbytes = _mean(cell, "host_link_bytes_per_step")
            label = cell["label"]
            picked = {(r.get("sharding_group_size"), r.get("replica_layout")) for r in cell["runs"]}
            if cell["strategy"].get("auto"):
                label += ": " + ", ".join(f"L={g} {lay}" for g, lay in sorted(picked, key=str))
            if retired_option(cell["strategy"]):
                label += " (retired)"
                retired_rows = True
            step, predicted = _mean(cell, "step_s"), _mean(cell, "predicted_step_s")
            lines.append(
                f"| {label} | {_fmt(sps, '.0f')} | {rounds} | {_fmt(ratio, '.2f')} | "
                f"{_fmt(_mean(cell, 'eval_auc'), '.4f')} | "
                f"{_fmt(None if nbytes is None else nbytes / 1e6, '.3f')} | "
                f"1/{next(iter(picked))[0] if picked else '?'} | "
                f"{_fmt(None if step is None else step * 1e3, '.0f')} / "
                f"{_fmt(None if predicted is None else predicted * 1e3, '.0f')} |"
            )
        lines += [""] + _verdicts(cells, _mean)
        unshaped = groups.get((hosts, nproc, "none"), [])
        if link != "none" and unshaped:
            lines += bounds_table(cells, unshaped, hosts, link)
        errors = [(c["label"], r["error"]) for c in cells for r in c["runs"] if "error" in r]
        lines += [f"- {label} failed: {error}" for label, error in errors[:5]] + [""]
    if retired_rows:
        lines += (
            [
                "Rows marked (retired) ran an option this measurement and the flat host's (section "
                "sync-options) retired (issue 56 item 1; `sparse2d/sync/options.py`, `RETIRED`): "
                "they are the evidence of its retirement, not a setting that runs now (the "
                "trainer refuses the key).",
                "",
            ]
            + [f"- {line}" for line in options_reading(result)]
            + [""]
        )
    return "\n".join(lines)


def options_figures(result: dict[str, Any]) -> dict[str, dict[str, dict[str, float | None]]]:
    """Per link, per setting (engine, then its switch if any: ``auto``, ``dense
    compression=bf16``): mean samples/s, eval AUC and host-link bytes per step. What the
    options preset's reading, and the flat host's sync-options section, quote."""
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for cell in result["cells"]:
        name = " ".join(
            x for x in (cell["strategy"]["engine"], stored_switch(cell["strategy"])) if x
        )
        out.setdefault(cell["link"], {})[name] = {
            key: _mean(cell, key)
            for key in ("samples_per_s", "eval_auc", "host_link_bytes_per_step")
        }
    return out


def _ratio(
    a: dict[str, float | None], b: dict[str, float | None], key: str = "samples_per_s"
) -> str:
    return _fmt(a[key] / b[key] if a.get(key) and b.get(key) else None, ".2f") + "x"


def options_reading(result: dict[str, Any]) -> list[str]:
    """What the options run says of each retired option and of the engines, per link, from
    its cells alone (``options_figures``)."""
    out = []
    for link, runs in options_figures(result).items():
        auto, dense = runs.get("auto"), runs.get("dense")
        parts = []
        if auto and runs.get("auto hide=true"):
            parts.append(
                f"`auto` run twice (`auto hide`: the same setting): {_ratio(runs['auto hide=true'], auto)}, this run's noise"
            )
        if auto and runs.get("auto overlap=true"):
            o = runs["auto overlap=true"]
            parts.append(
                f"overlap {_ratio(o, auto)} of `auto`, eval AUC {_fmt(o['eval_auc'], '.3f')} vs "
                f"{_fmt(auto['eval_auc'], '.3f')}"
            )
        bf16 = runs.get("dense compression=bf16")
        if bf16 and dense:
            parts.append(
                f"bf16 {_ratio(bf16, dense)} of dense and {_ratio(bf16, auto) if auto else '-'} of "
                f"`auto`, host-link bytes {_ratio(bf16, dense, 'host_link_bytes_per_step')} of dense's"
            )
        if auto and dense:
            parts.append(f"`auto` {_ratio(auto, dense)} of dense")
        if parts:
            out.append(f"{link}: " + "; ".join(parts) + ".")
    return out


def bounds_table(
    cells: list[dict[str, Any]], unshaped: list[dict[str, Any]], hosts: int, link: str
) -> list[str]:
    """Each strategy's step against its two bounds: compute (the same strategy on unshaped
    links, measured in the same run) and link (the bytes a host sent per step, from the
    interface counters, over the link rate); then the streamed sync against the burst."""
    compute = {c["label"]: _mean(c, "step_s") for c in unshaped}
    rate = link_bits(link) / 8  # bytes/s, each way
    out = [
        "",
        "| strategy | step ms | compute bound ms | link bound ms | step / larger bound |",
        "|---|---:|---:|---:|---:|",
    ]
    for cell in cells:
        step, nbytes = _mean(cell, "step_s"), _mean(cell, "host_link_bytes_per_step")
        bound = compute.get(cell["label"])
        wire = None if nbytes is None else nbytes / hosts / rate
        larger = max(b for b in (bound, wire) if b is not None) if bound or wire else None
        out.append(
            f"| {cell['label']} | {_fmt(None if step is None else step * 1e3, '.0f')} | "
            f"{_fmt(None if bound is None else bound * 1e3, '.0f')} | "
            f"{_fmt(None if wire is None else wire * 1e3, '.0f')} | "
            f"{_fmt(step / larger if step and larger else None, '.2f')} |"
        )
    out += [
        "",
        "Compute bound: the same strategy with unshaped links (`LINK=none`), this run. Link "
        "bound: bytes crossing one host's link per step (counters, summed over hosts, / hosts) "
        "over the link's rate.",
    ]
    streamed = [c for c in cells if stored_switch(c["strategy"]) == "stream=true"]
    for cell in streamed:
        burst = [
            c
            for c in cells
            if not stored_switch(c["strategy"])
            and {k: v for k, v in c["strategy"].items() if k != "switch"}
            == {k: v for k, v in cell["strategy"].items() if k != "switch"}
        ]
        one_d = [c for c in cells if c["label"] == "1D"]
        sps = _mean(cell, "samples_per_s")
        for other, name in ((burst, "the burst sync"), (one_d, "1D")):
            if other and sps and _mean(other[0], "samples_per_s"):
                ratio = sps / _mean(other[0], "samples_per_s")
                auc = _mean(cell, "eval_auc")
                delta = None if auc is None else auc - (_mean(other[0], "eval_auc") or auc)
                out.append(
                    f"- {cell['label']}: {ratio:.2f}x {name} ({other[0]['label']}) in samples/s; "
                    f"eval AUC {_fmt(delta, '+.4f')} against it."
                )
    return out + [""]


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
