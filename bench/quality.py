"""Quality study: eval AUC and NE of 1D training versus 2D sync strategies across cadence N.

World 4 (gloo, CPU), planted-signal synthetic CTR data (``configs/tiny_cpu.yaml``: DLRM,
8 tables, row-wise AdaGrad), one fixed seed and sample budget for every run. 1D is the
same trainer with one sharding group of 4 (no replicas); 2D uses groups of L=2 (2
replicas) synced every N in {1, 4, 16, 64} steps with each strategy:

* ``plain``: average weights and optimizer state;
* ``delayed``: optimizer state averaged one sync behind the weights;
* ``momentum``: AdaGrad accumulator growth divided by the number of replica groups.

(``bf16`` deltas were measured here too until they were retired, issue 56: their rows stay
in the stored results, and the quality sections mark them as their retirement's evidence,
until this bench is re-run; ``--render`` rewrites a section from its stored JSON.)

Every run goes through the real trainer loop (``sparse2d.train.loop.Loop``) in one pool of 4
spawned ranks (no per-run start-up). Writes ``bench/results/quality_results.json``,
``bench/results/quality_auc_vs_n.png`` and the section between the quality markers of
``bench/RESULTS.md``. Usage: ``.venv/bin/python bench/quality.py [--steps 800]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

import torch.multiprocessing as mp
from bench_util import (
    RESULTS_DIR,
    init_gloo,
    rendezvous,
    rendezvous_env,
    stored_stamp,
    write_section,
)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CONFIG = os.path.join(ROOT, "configs", "tiny_cpu.yaml")
CADENCES = (1, 4, 16, 64)
RETIRED = ("bf16",)
"""Strategies of stored runs whose option was retired (issue 56): rows marked, never run."""
STRATEGIES: dict[str, list[str]] = {
    "plain": [],
    "delayed": ["parallel.sync.delayed_optimizer_state=true"],
    "momentum": ["parallel.sync.momentum_scaling=true"],
}
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "tiny": ("`configs/tiny_cpu.yaml` as shipped", []),
    "hard": (
        "`configs/tiny_cpu.yaml` with a harder sparse signal: effects on the 1000 hottest rows "
        "(capped by table size), Zipf exponent 0.8 (ids spread, rows seen rarely), sparse "
        "effect sd 1.0, dense sd 0.2, sparse lr 0.3",
        [
            "data.synthetic.signal_rows=1000",
            "data.synthetic.zipf_exponent=0.8",
            "data.synthetic.sparse_weight=1.0",
            "data.synthetic.dense_weight=0.2",
            "optimizer.sparse.lr=0.3",
        ],
    ),
}


def runs(
    steps: int, eval_batches: int, work: str, variant: str
) -> list[tuple[str, int | None, list[str]]]:
    """(strategy, N, overrides) for every run; N is None for 1D."""
    common = [
        *VARIANTS[variant][1],
        f"train.steps={steps}",
        "train.eval_every=0",
        f"train.eval_batches={eval_batches}",
        f"train.log_every={steps}",
        "train.progress_bar=false",
        "checkpoint.every=0",
    ]
    out: list[tuple[str, int | None, list[str]]] = [
        ("1D", None, [*common, "parallel.sharding_group_size=4", f"run_dir={work}/1d"])
    ]
    for name, extra in STRATEGIES.items():
        for n in CADENCES:
            overrides = [*common, "parallel.sharding_group_size=2", f"parallel.sync.every={n}"]
            out.append((name, n, [*overrides, *extra, f"run_dir={work}/{name}_{n}"]))
    return out


def _worker(rank: int, world: int, where: str, plan: list, results: Any) -> None:
    rendezvous_env(rank, world, where)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    init_gloo(300)
    from sparse2d.train.config import load_config
    from sparse2d.train.loop import Loop
    from sparse2d.train.model_builder import resolve_device

    for strategy, n, overrides in plan:
        start = time.perf_counter()
        cfg = load_config(CONFIG, overrides)
        summary = Loop(cfg, resolve_device(cfg)).run()  # the trainer's loop, in-process
        if rank == 0:
            keep = ("eval_auc", "eval_ne", "eval_loss", "planted_auc", "sync_s_per_step")
            row = {k: summary.get(k) for k in keep}
            row.update(strategy=strategy, every=n, seconds=time.perf_counter() - start)
            results.put(row)
            print(json.dumps(row), flush=True)
    dist.destroy_process_group()


def study(
    steps: int, eval_batches: int, variant: str, only: list[str] | None = None
) -> list[dict[str, Any]]:
    where = rendezvous()
    with tempfile.TemporaryDirectory() as work:
        plan = runs(steps, eval_batches, work, variant)
        if only:
            plan = [p for p in plan if f"{p[0]}_{p[1]}" in only or p[0] in only]
        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(r, 4, where, plan, results)) for r in range(4)]
        for p in procs:
            p.start()
        rows = [results.get(timeout=1800) for _ in plan]
        for p in procs:
            p.join(timeout=60)
    return rows


def _label(strategy: str) -> str:
    return f"{strategy} (retired)" if strategy in RETIRED else strategy


def table(rows: list[dict[str, Any]]) -> str:
    base = next(r for r in rows if r["strategy"] == "1D")
    lines = [
        "| setting | N | eval AUC | AUC - 1D | eval NE | run s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        n = "-" if r["every"] is None else str(r["every"])
        lines.append(
            f"| {_label(r['strategy'])} | {n} | {r['eval_auc']:.4f} | {r['eval_auc'] - base['eval_auc']:+.4f}"
            f" | {r['eval_ne']:.4f} | {r['seconds']:.0f} |"
        )
    return "\n".join(lines)


def verdict(rows: list[dict[str, Any]]) -> str:
    base = next(r for r in rows if r["strategy"] == "1D")["eval_auc"]
    largest = max(CADENCES)
    at = {r["strategy"]: r["eval_auc"] for r in rows if r["every"] == largest}
    close = [_label(s) for s, auc in at.items() if abs(auc - base) <= 0.002]
    best = max(at, key=lambda s: at[s])
    retired = sorted({r["strategy"] for r in rows} & set(RETIRED))
    return (
        f"At N={largest}: within 0.002 AUC of 1D ({base:.4f}): "
        + (", ".join(close) if close else "none")
        + f"; best {_label(best)} ({at[best]:.4f}, {at[best] - base:+.4f})."
        + (
            f"\n\nRows marked (retired): {', '.join(retired)} deltas (`compression: bf16`), "
            "measured before issue 56 retired the option (section sync-options): the evidence "
            "of its retirement, not a strategy that runs now."
            if retired
            else ""
        )
    )


def plot(rows: list[dict[str, Any]], path: str, variant: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = next(r for r in rows if r["strategy"] == "1D")["eval_auc"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in STRATEGIES:
        points = sorted((r["every"], r["eval_auc"]) for r in rows if r["strategy"] == name)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"2D {name}")
    ax.axhline(base, color="k", linestyle="--", label="1D")
    ax.axhspan(base - 0.002, base + 0.002, color="k", alpha=0.08, label="1D ± 0.002")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(CADENCES), [str(n) for n in CADENCES])
    ax.set_xlabel("sync every N steps")
    ax.set_ylabel("eval AUC")
    ax.set_title(f"World 4, L=2 (2 replicas), planted-signal CTR ({variant})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def section(result: dict[str, Any], variant: str) -> str:
    """The RESULTS.md section of a run's JSON (``quality_results[_<variant>].json``)."""
    rows = result["rows"]
    steps, eval_batches = result["steps"], result["eval_batches"]
    suffix = "" if variant == "tiny" else f"_{variant}"
    planted = rows[0].get("planted_auc")
    minutes = result.get("minutes")
    return (
        f"## Quality: 1D vs 2D sync strategies, {variant} data (bench/quality.py)\n\n"
        f"World 4 gloo CPU ranks, {VARIANTS[variant][0]} (DLRM, 8 tables, row-wise "
        f"AdaGrad, batch 128/rank), {steps} steps (same {steps * 512} samples for every run), "
        f"eval on {eval_batches * 512} held-out samples"
        + (f" (planted-model AUC {planted:.4f})" if planted else "")
        + ". 2D = L=2, 2 replicas. One seed"
        + (f"; {minutes:.1f} min total on a shared 2-core machine" if minutes else "")
        + f". Plot: `bench/results/quality_auc_vs_n{suffix}.png`. Reproduce: "
        f"`.venv/bin/python bench/quality.py --variant {variant} --steps {steps}`.\n\n"
        + table(rows)
        + "\n\n"
        + verdict(rows)
    )


MARKERS = {"tiny": "quality", "hard": "quality_hard"}
"""Each variant's section of bench/RESULTS.md."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=800, help="optimizer steps per run")
    parser.add_argument("--eval-batches", type=int, default=40, help="eval batches per rank")
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="tiny")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--only", nargs="*", help="subset, e.g. 1D plain_64 (implies --no-write)")
    parser.add_argument("--render", action="store_true", help="rewrite the section from JSON")
    args = parser.parse_args(argv)
    suffix = "" if args.variant == "tiny" else f"_{args.variant}"
    stored = RESULTS_DIR / f"quality_results{suffix}.json"
    marker = MARKERS[args.variant]
    if args.render:
        text = section(json.loads(stored.read_text()), args.variant)
        write_section(text, marker, stamp=stored_stamp(marker, RESULTS_DIR))
        return 0
    start = time.perf_counter()
    rows = study(args.steps, args.eval_batches, args.variant, args.only)
    if args.only:
        print(json.dumps(rows, indent=1))
        return 0
    result = {
        "steps": args.steps,
        "eval_batches": args.eval_batches,
        "minutes": (time.perf_counter() - start) / 60,
        "rows": rows,
    }
    text = section(result, args.variant)
    print(text)
    if args.no_write:
        return 0
    stored.write_text(json.dumps(result, indent=2))
    plot(rows, str(RESULTS_DIR / f"quality_auc_vs_n{suffix}.png"), args.variant)
    write_section(text, marker)
    return 0


if __name__ == "__main__":
    sys.exit(main())
