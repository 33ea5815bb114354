"""Quality study: eval AUC and NE of 1D training versus 2D sync strategies across cadence N.

World 4 (gloo, CPU), planted-signal synthetic CTR data (``configs/tiny_cpu.yaml``: DLRM,
8 tables, row-wise AdaGrad), one fixed seed and sample budget for every run. 1D is the
same trainer with one sharding group of 4 (no replicas); 2D uses groups of L=2 (2
replicas) synced every N in {1, 4, 16, 64} steps with each strategy:

* ``plain``: average weights and optimizer state;
* ``delayed``: optimizer state averaged one sync behind the weights;
* ``momentum``: AdaGrad accumulator growth divided by the number of replica groups.

(``bf16`` deltas were measured here too until they were retired, issue 56: their rows stay
in the stored results and the quality sections until this bench is re-run.)

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
from bench_util import init_gloo, rendezvous, rendezvous_env, write_section

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CONFIG = os.path.join(ROOT, "configs", "tiny_cpu.yaml")
CADENCES = (1, 4, 16, 64)
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


def table(rows: list[dict[str, Any]]) -> str:
    base = next(r for r in rows if r["strategy"] == "1D")
    lines = [
        "| setting | N | eval AUC | AUC - 1D | eval NE | run s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        n = "-" if r["every"] is None else str(r["every"])
        lines.append(
            f"| {r['strategy']} | {n} | {r['eval_auc']:.4f} | {r['eval_auc'] - base['eval_auc']:+.4f}"
            f" | {r['eval_ne']:.4f} | {r['seconds']:.0f} |"
        )
    return "\n".join(lines)


def verdict(rows: list[dict[str, Any]]) -> str:
    base = next(r for r in rows if r["strategy"] == "1D")["eval_auc"]
    largest = max(CADENCES)
    at = {r["strategy"]: r["eval_auc"] for r in rows if r["every"] == largest}
    close = [s for s, auc in at.items() if abs(auc - base) <= 0.002]
    best = max(at, key=lambda s: at[s])
    return (
        f"At N={largest}: within 0.002 AUC of 1D ({base:.4f}): "
        + (", ".join(close) if close else "none")
        + f"; best {best} ({at[best]:.4f}, {at[best] - base:+.4f})."
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=800, help="optimizer steps per run")
    parser.add_argument("--eval-batches", type=int, default=40, help="eval batches per rank")
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="tiny")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--only", nargs="*", help="subset, e.g. 1D plain_64 (implies --no-write)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    rows = study(args.steps, args.eval_batches, args.variant, args.only)
    if args.only:
        print(json.dumps(rows, indent=1))
        return 0
    minutes = (time.perf_counter() - start) / 60
    text = table(rows)
    summary = verdict(rows)
    print(text, summary, f"total {minutes:.1f} min", sep="\n")
    if args.no_write:
        return 0
    suffix = "" if args.variant == "tiny" else f"_{args.variant}"
    with open(os.path.join(HERE, "results", f"quality_results{suffix}.json"), "w") as f:
        json.dump(
            {"steps": args.steps, "eval_batches": args.eval_batches, "rows": rows}, f, indent=2
        )
    png = f"quality_auc_vs_n{suffix}.png"
    plot(rows, os.path.join(HERE, "results", png), args.variant)
    planted = rows[0].get("planted_auc")
    header = (
        f"## Quality: 1D vs 2D sync strategies, {args.variant} data (bench/quality.py)\n\n"
        f"World 4 gloo CPU ranks, {VARIANTS[args.variant][0]} (DLRM, 8 tables, row-wise "
        f"AdaGrad, batch 128/rank), {args.steps} steps (same {args.steps * 512} samples for every run), "
        f"eval on {args.eval_batches * 512} held-out samples"
        + (f" (planted-model AUC {planted:.4f})" if planted else "")
        + f". 2D = L=2, 2 replicas. One seed; {minutes:.1f} min total on a shared 2-core "
        f"machine. Plot: `bench/{png}`. Reproduce: `.venv/bin/python bench/quality.py "
        f"--variant {args.variant} --steps {args.steps}`.\n\n"
    )
    marker = {"": "quality", "_hard": "quality_hard"}[suffix]  # the RESULTS.md sections
    write_section(header + text + "\n\n" + summary, marker)
    return 0


if __name__ == "__main__":
    sys.exit(main())
