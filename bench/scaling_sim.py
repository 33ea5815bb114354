"""Simulate the large config from 64 to 4096 ranks: full sharding vs the advisor's best 2D.

No process group, meta-device tables: the advisor's cost model on the ``h100_8x`` topology
(weak scaling: ``data.batch_size_per_rank`` fixed). Writes ``bench/results/scaling.png`` (estimated
step time and all-to-all time vs ranks) and a section of ``bench/RESULTS.md``.
Usage: ``.venv/bin/python bench/scaling_sim.py [--config configs/dlrm_large_1024gpu.yaml]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/dlrm_large_1024gpu.yaml")
    parser.add_argument("--topology", default="h100_8x")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
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
