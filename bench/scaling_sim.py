"""Simulate the large config from 64 to 4096 ranks: full sharding vs the advisor's best 2D.

No process group, meta-device tables: the advisor's cost model on the ``h100_8x`` topology
(weak scaling: ``data.batch_size_per_rank`` fixed). Writes ``bench/results/scaling.png`` (estimated
step time and all-to-all time vs ranks) and a section of ``bench/RESULTS.md``.
Usage: ``.venv/bin/python bench/scaling_sim.py [--config configs/dlrm_large_1024gpu.yaml]``.

``--emulated``: the forecast anchored on the emulated cluster instead (issue 65): the cluster
main job (``configs/cluster_cpu.yaml``) on hosts of 4 ranks like the dilated cells of
``bench/scaling_bench.py`` (each host the 2-host cell's: its cores, its link), from 8 to
4,096 ranks, in samples/s per rank per dilated second, with the measured cells on the same
plot and the compute and link bounds drawn (``sparse2d.advisor.forecast``; no constant
fitted on the measured cells). Writes ``bench/results/scaling_forecast.png`` and the
``scaling-forecast`` section.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from bench_util import write_section

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

WORLDS = (64, 128, 256, 512, 1024, 2048, 4096)
PAPER = {1024: 0.96, 2048: 0.95, 4096: 0.90}  # vs 256 GPUs, approximate (DESIGN.md section 4)


def simulate(config: str, topology: str) -> list[dict[str, object]]:
    from sparse2d.advisor.search import advise
    from sparse2d.train.advisor_command import topology_for, workload_from_config
    from sparse2d.train.config import load_config

    cfg = load_config(config)
    workload = workload_from_config(cfg)
    rows = []
    for world in WORLDS:
        advice = advise(workload, topology_for(cfg, world, topology))
        full = advice.candidate(world)
        best = advice.candidate(advice.recommended) if advice.recommended else None
        blog = advice.candidate(256) if world % 256 == 0 else None
        rows.append({"world": world, "full": full, "best": best, "blog": blog})
    return rows


def plot(rows: list[dict[str, object]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    worlds = [r["world"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, title in (
        (axes[0], "step_s", "estimated step time"),
        (axes[1], "a2a_s", "lookup all-to-all time"),
    ):
        full = [getattr(r["full"], key) for r in rows]
        fits = [r["full"].fits for r in rows]  # type: ignore[attr-defined]
        ax.plot(worlds, full, "o--", color="tab:red", label="full sharding (L = ranks)")
        ax.scatter(
            [w for w, f in zip(worlds, fits) if not f],
            [v for v, f in zip(full, fits) if not f],
            marker="x",
            s=90,
            color="black",
            zorder=3,
            label="full sharding does not fit memory",
        )
        best = [
            (r["world"], getattr(r["best"], key), r["best"].sharding_group_size)
            for r in rows
            if r["best"] is not None
        ]  # type: ignore[attr-defined]
        ax.plot(
            [b[0] for b in best],
            [b[1] for b in best],
            "o-",
            color="tab:blue",
            label="best 2D (advisor's L)",
        )
        for w, v, L in best:
            ax.annotate(
                f"L={L}", (w, v), textcoords="offset points", xytext=(0, 7), ha="center", fontsize=8
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("ranks (8x H100 hosts)")
        ax.set_ylabel("seconds per step")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("dlrm_large_1024gpu: advisor cost model, weak scaling (4096 samples/rank)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _types(c: object) -> str:
    from sparse2d.advisor.render import types_text

    return types_text(c)  # type: ignore[arg-type]


def table(rows: list[dict[str, object]]) -> str:
    base = next(r for r in rows if r["world"] == 256)["best"]
    lines = [
        "| ranks | full: step ms | full fits | best L | best: sharding | compute | output a2a "
        "| input a2a | sync | dense AR | step ms | eff. vs 256 | paper | L=256: step ms (types) |",
        "|---:|---:|:---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        f, b, blog = r["full"], r["best"], r["blog"]
        paper = PAPER.get(r["world"])  # type: ignore[arg-type]
        cells = [f"{r['world']}", f"{f.step_s * 1e3:.0f}", "yes" if f.fits else "no"]  # type: ignore[union-attr]
        if b is not None:
            t = dict(b.terms)  # type: ignore[union-attr]
            cells += [
                f"{b.sharding_group_size}",
                _types(b),
                *(
                    f"{t[k] * 1e3:.0f}"
                    for k in (  # type: ignore[union-attr]
                        "compute",
                        "output_a2a",
                        "input_a2a",
                        "sync",
                        "dense_allreduce",
                    )
                ),
                f"{b.step_s * 1e3:.0f}",
                f"{base.step_s / b.step_s:.2f}",  # type: ignore[union-attr]
            ]
        else:
            cells += ["-"] * 10
        cells.append(f"{paper:.2f}" if paper else "")
        cells.append(
            f"{blog.step_s * 1e3:.0f} ({_types(blog)}){'' if blog.fits else ' no fit'}"  # type: ignore[union-attr]
            if blog
            else ""
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def header(config: str, topology: str, cpu_s: float) -> str:
    """What the table is: the command, the config and topology, how to read the columns."""
    return (
        "## Group-size advisor: scale study with the new terms (bench/scaling_sim.py)\n\n"
        f"Command: `PYTHONPATH=. .venv/bin/python bench/scaling_sim.py --config {config} "
        f"--topology {topology}` (no process group, meta-device tables; writes "
        f"`bench/results/scaling.png` and this table; {cpu_s:.0f} s of CPU for all "
        f"{len(WORLDS)} worlds). Weak scaling: `data.batch_size_per_rank` fixed, the trainer's "
        "sync settings of the config; the topology preset's figures are vendor figures with "
        "stated derates, none fitted to a GPU (`sparse2d/advisor/presets/`). Term columns are "
        'ms per step of the best L; "L=256" is the blog\'s group size at that world. '
        "Efficiency = best step at 256 ranks / best step at N. How to read it: "
        "`docs/advisor_cost_model.md`.\n\n"
        "![scaling](results/scaling.png)\n\n"
    )


EMULATED_WORLDS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def emulated_forecast(config: str, link: str, nproc: int) -> tuple[list[Any], list[Any]]:
    """The forecast on dilated hosts (each the 2-host cell's cores and ``link``): per world,
    1D and the advisor's best (``forecast.Point``) and the shipped 2D layout (L = ranks per
    host, the config's replica layout)."""
    import tempfile

    from sparse2d.advisor.forecast import forecast
    from sparse2d.advisor.search import advise
    from sparse2d.advisor.topology import load_topology
    from sparse2d.train.advisor_command import workload_from_config
    from sparse2d.train.config import load_config
    from sparse2d.train.emulated_topology import BASE_HOSTS, topology_yaml

    workload = workload_from_config(load_config(config))
    with tempfile.TemporaryDirectory() as folder:

        def at(world: int) -> Any:
            path = os.path.join(folder, f"{world}.yaml")
            with open(path, "w") as f:
                f.write(topology_yaml(world // nproc, nproc, link, base_hosts=BASE_HOSTS))
            return load_topology(path, world)

        points = forecast(workload, at, EMULATED_WORLDS)
        shipped = [advise(workload, at(w)).candidate(nproc) for w in EMULATED_WORLDS]
    return points, shipped


def measured_points(path: str) -> dict[str, list[tuple[int, float]]]:
    """The scaling bench's fixed-workload cells: (ranks, samples/s per rank per dilated
    second), mean over the rounds, by strategy kind."""
    import json
    import statistics

    if not os.path.exists(path):
        return {}
    out: dict[str, list[tuple[int, float]]] = {}
    for cell in json.load(open(path))["cells"]:
        runs = [r["samples_per_s"] for r in cell["runs"] if "samples_per_s" in r]
        if cell["workload"] != "fixed" or not runs:
            continue
        world = cell["hosts"] * cell["nproc"]
        per_rank = statistics.fmean(runs) * cell["dilation"] / world
        out.setdefault(cell["kind"], []).append((world, per_rank))
    return out


def emulated_plot(points: list[Any], shipped: list[Any], measured: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    worlds = [p.world for p in points]
    fig, ax = plt.subplots(figsize=(8.5, 5))
    one_d = [p.one_d for p in points]
    for name, series, color in (
        ("1D", one_d, "tab:red"),
        ("2D shipped (L=4 inter)", shipped, "tab:blue"),
    ):
        ax.plot(
            worlds,
            [p.batch_per_rank / c.step_s for p, c in zip(points, series)],
            "-",
            color=color,
            label=f"{name}: forecast",
        )
        ax.plot(
            worlds,
            [p.compute_bound(c) for p, c in zip(points, series)],
            ":",
            color=color,
            linewidth=1,
            label=f"{name}: compute bound",
        )
        link = [p.link_bound(c) for p, c in zip(points, series)]
        ax.plot(
            [w for w, v in zip(worlds, link) if v],
            [v for v in link if v],
            "--",
            color=color,
            linewidth=1,
            label=f"{name}: link bound",
        )
    best = [(p.world, p.samples_per_rank(p.best)) for p in points if p.best is not None]
    ax.plot(
        [b[0] for b in best],
        [b[1] for b in best],
        "-.",
        color="tab:green",
        linewidth=1,
        label="advisor's best L: forecast",
    )
    for kind, marker, color in (
        ("1d", "o", "tab:red"),
        ("2d", "s", "tab:blue"),
        ("rep", "^", "tab:gray"),
    ):
        xs = measured.get(kind, [])
        if xs:
            ax.scatter(
                [x[0] for x in xs],
                [x[1] for x in xs],
                marker=marker,
                s=60,
                color=color,
                edgecolor="black",
                zorder=3,
                label=f"{kind}: measured (dilated)",
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("ranks (hosts of 4 ranks)")
    ax.set_ylabel("samples/s per rank (per dilated second)")
    ax.set_title("cluster_cpu on dilated emulated hosts: measured 8-32 ranks, forecast to 4,096")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def emulated_table(points: list[Any], shipped: list[Any], measured: dict) -> str:
    got = {(k, w): v for k, xs in measured.items() for w, v in xs}
    lines = [
        "| ranks | 1D: forecast (measured) | 1D compute / link bound | 1D MB/host/step | 2D L=4 inter: "
        "forecast (measured) | 2D compute / link bound | 2D MB/host/step | 2D / 1D | best L: samples/s/rank |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]

    def m(kind: str, world: int) -> str:
        value = got.get((kind, world))
        return f" ({value:.0f})" if value is not None else ""

    def bound(p: Any, c: Any) -> str:
        link = p.link_bound(c)
        return f"{p.compute_bound(c):,.0f} / " + ("-" if link is None else f"{link:,.0f}")

    for p, s in zip(points, shipped):
        best = p.best
        lines.append(
            f"| {p.world} | {p.samples_per_rank(p.one_d):,.1f}{m('1d', p.world)} | {bound(p, p.one_d)} | "
            f"{p.one_d.host_link_bytes / 1e6:,.2f} | {p.batch_per_rank / s.step_s:,.1f}{m('2d', p.world)} | "
            f"{bound(p, s)} | {s.host_link_bytes / 1e6:,.2f} | {p.one_d.step_s / s.step_s:.2f}x | "
            + (
                "-"
                if best is None
                else f"L={best.sharding_group_size}: {p.samples_per_rank(best):,.1f}"
            )
            + " |"
        )
    return "\n".join(lines)


def emulated_main(args: argparse.Namespace) -> int:
    measured = measured_points(os.path.join(HERE, "results", "scaling_bench.json"))
    points, shipped = emulated_forecast(args.config, args.link, args.nproc)
    text = emulated_table(points, shipped, measured)
    print(text)
    if args.no_write:
        return 0
    emulated_plot(points, shipped, measured, os.path.join(HERE, "results", "scaling_forecast.png"))
    one = {p.world: p for p in points}
    head = (
        "## Scaling forecast anchored on the emulated cluster (bench/scaling_sim.py --emulated)\n\n"
        f"Command: `PYTHONPATH=. .venv/bin/python bench/scaling_sim.py --emulated` (after "
        "`bench/scaling_bench.py`, whose fixed-workload cells it plots). Workload "
        f"`{args.config}`, weak scaling (512 samples per rank); every host as the 2-host cell's: "
        f"{args.nproc} ranks, the cores of this 2-core box, a {args.link} link (the "
        "`cpu_gloo` preset via `sparse2d.train.emulated_topology.topology_yaml(..., "
        "base_hosts=2)`): samples/s per rank per dilated second, the unit the measured "
        "cells are converted to (x hosts / 2). Terms: the cost model's (docs/"
        "advisor_cost_model.md), no constant fitted on the measured cells. Bounds: compute "
        "only (lookups + dense) and host link only (`Candidate.host_link_bytes` at the link's "
        "rate). Measured values in parentheses. At 1,024 ranks 1D forecasts "
        f"{one[1024].samples_per_rank(one[1024].one_d):.1f} and the shipped 2D "
        f"{512 / shipped[EMULATED_WORLDS.index(1024)].step_s:.1f} samples/s per rank; at 4,096 "
        f"{one[4096].samples_per_rank(one[4096].one_d):.1f} and "
        f"{512 / shipped[EMULATED_WORLDS.index(4096)].step_s:.1f}.\n\n"
        "![scaling forecast](results/scaling_forecast.png)\n\n"
    )
    write_section(head + text, "scaling-forecast")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None)
    parser.add_argument("--topology", default="h100_8x")
    parser.add_argument("--emulated", action="store_true", help="the emulated-cluster forecast")
    parser.add_argument("--link", default="200mbit", help="--emulated: each host's link")
    parser.add_argument("--nproc", type=int, default=4, help="--emulated: ranks per host")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    if args.emulated:
        args.config = args.config or "configs/cluster_cpu.yaml"
        return emulated_main(args)
    args.config = args.config or "configs/dlrm_large_1024gpu.yaml"
    start = time.process_time()
    rows = simulate(args.config, args.topology)
    cpu_s = time.process_time() - start
    text = table(rows)
    print(text)
    print(f"planning CPU time for all {len(WORLDS)} worlds: {cpu_s:.0f} s")
    if not args.no_write:
        plot(rows, os.path.join(HERE, "results", "scaling.png"))
        write_section(header(args.config, args.topology, cpu_s) + text, "scaling-sim-terms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
