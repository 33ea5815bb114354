"""Where a training step goes: data, lookup (incl. all-to-alls), dense, sync, per (world, L).

The main job's model (``configs/tiny_cpu.yaml``: DLRM over 8 table-wise tables,
row-wise AdaGrad, default sync engine) at the same global batch for world 2, 4
and 8 and every sharding group size ``L`` dividing the world. Per step, on every
rank: *data* = building this rank's batch; *step* = forward, backward (fused
embedding update) and dense optimizer step; *sync* = the replica sync (its report's
seconds when it ran at the end of the backward, its vote carried by DDP);
*lookup* = the sharded EmbeddingBagCollection alone on the same batch (input
all-to-all, lookup, output all-to-all, backward all-to-all and a zero-gradient
fused update, which leaves the weights unchanged), timed separately because
TorchRec's output all-to-all is awaited lazily inside the dense forward;
*dense* = step - lookup. Per step the slowest rank counts; min/median/max over
steps.

Run: ``.venv/bin/python bench/step_breakdown.py`` (about 5 minutes on 2 cores).
Writes ``bench/results/step_breakdown.json``, ``bench/results/step_breakdown.png`` and the
``step-breakdown`` section of ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from bench_util import RESULTS_DIR, publish, spawn, stats, timed

HERE = Path(__file__).resolve().parent
CONFIG = str(HERE.parent / "configs" / "tiny_cpu.yaml")
PHASES = ("data", "lookup", "dense", "sync")
WORLDS = (2, 4, 8)
GLOBAL_BATCH = 512


def breakdown_rank(group_sizes: list[int], steps: int, warmup: int, global_batch: int) -> list:
    """On every rank of the current process group: the breakdown for each ``L``."""
    from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection

    from sparse2d.train.config import load_config
    from sparse2d.train.data import DataSource
    from sparse2d.train.model_builder import build_model, dense_optimizer, shard

    world, rank = dist.get_world_size(), dist.get_rank()
    device = torch.device("cpu")
    out = []
    for size in group_sizes:
        overrides = [
            f"parallel.sharding_group_size={size}",
            f"data.batch_size_per_rank={global_batch // world}",
            "parallel.sync.divergence_every=0",
        ]
        cfg = load_config(CONFIG, overrides)
        model = shard(cfg, build_model(cfg, device), device, world)
        optimizer = dense_optimizer(cfg, model)
        data = DataSource(cfg, rank, world)
        ebc = next(m for m in model.modules() if isinstance(m, ShardedEmbeddingBagCollection))
        rows = []
        for step in range(warmup + steps):
            t0 = time.perf_counter()
            batch = data.train(step)[0].to(device)
            t1 = time.perf_counter()
            loss, _ = model(batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            t2 = time.perf_counter()
            report = model.maybe_sync(step)
            t3 = time.perf_counter()
            values = ebc(batch.sparse_features).wait().values()
            values.backward(torch.zeros_like(values))  # zero gradient: weights unchanged
            t4 = time.perf_counter()
            # a sync carried by DDP ran at the end of the backward (t1..t2): its own seconds
            sync = max(t3 - t2, report.seconds if report is not None else 0.0)
            inside = sync - (t3 - t2)
            if step >= warmup:
                lookup = t4 - t3
                dense = max(0.0, (t2 - t1) - lookup - inside)
                rows.append([t1 - t0, lookup, dense, sync, t2 - t1 - inside])
        slowest = torch.tensor(rows, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        cols = slowest.t().tolist()
        entry: dict[str, Any] = {"world": world, "L": size, "replicas": world // size}
        entry.update({p: stats(c) for p, c in zip((*PHASES, "step"), cols, strict=True)})
        entry["total_ms_median"] = 1e3 * sum(entry[p]["median"] for p in ("data", "step", "sync"))
        out.append(entry)
        model.sync_policy.close()
        del model, optimizer
    return out


def _markdown(results: list[dict[str, Any]], args: argparse.Namespace, wall: float) -> str:
    lines = [
        "## Step breakdown per world size and sharding group size (bench/step_breakdown.py)",
        "",
        f"`configs/tiny_cpu.yaml` model (DLRM, 8 table-wise tables of 100-2000 rows x 16, "
        f"row-wise AdaGrad, sync every step, default engine), global batch {args.global_batch} "
        f"for every world size, gloo CPU ranks ({args.machine}; worlds of 4 and 8 "
        f"oversubscribe the cores: absolute ms are load-bound; "
        f"compare L within one world). {args.steps} measured steps after {args.warmup} warm-up, "
        f"slowest rank per step, ms as min / median / max over steps. *lookup* = sharded "
        f"EBC alone (input a2a, lookup, output a2a, backward a2a, fused update), *dense* = "
        f"forward+backward+dense optimizer minus lookup, *sync* = the replica sync's "
        f"exposed time (run at the end of the backward where its NaN/inf vote rides "
        f"DDP's all-reduce), "
        f"*data* = building the batch. Wall time {wall:.0f} s. Plot: `bench/results/step_breakdown.png`.",
        "",
        "| world | L | replicas | data ms | lookup ms | dense ms | sync ms | step+sync+data ms (median) |",
        "|---:|---:|---:|---|---|---|---|---:|",
    ]
    for r in results:
        cells = [
            f"{1e3 * r[p]['min']:.1f} / {1e3 * r[p]['median']:.1f} / {1e3 * r[p]['max']:.1f}"
            for p in PHASES
        ]
        lines.append(
            f"| {r['world']} | {r['L']} | {r['replicas']} | "
            + " | ".join(cells)
            + f" | {r['total_ms_median']:.1f} |"
        )
    lines += [
        "",
        f"Reproduce: `PYTHONPATH=. .venv/bin/python bench/step_breakdown.py --steps {args.steps}`.",
    ]
    return "\n".join(lines)


def _plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    labels = [f"W{r['world']} L{r['L']}" for r in results]
    bottom = [0.0] * len(results)
    for phase in PHASES:
        heights = [1e3 * r[phase]["median"] for r in results]
        ax.bar(labels, heights, bottom=bottom, label=phase)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set(
        ylabel="ms per step (median, slowest rank)",
        title="Step breakdown, same global batch (gloo CPU, 2 shared cores)",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=list(WORLDS))
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--global-batch", type=int, default=GLOBAL_BATCH)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-results-md", action="store_true", help="do not edit RESULTS.md")
    args = parser.parse_args()

    def every_world() -> list[dict[str, Any]]:
        results = []
        for world in args.worlds:
            sizes = [size for size in range(1, world + 1) if world % size == 0]
            results += spawn(
                world, breakdown_rank, sizes, args.steps, args.warmup, args.global_batch
            )
        return results

    results, wall = timed(args, every_world)
    args.out.mkdir(parents=True, exist_ok=True)
    _plot(results, args.out / "step_breakdown.png")
    publish(args, results, _markdown(results, args, wall), "step_breakdown.json", "step-breakdown")


if __name__ == "__main__":
    main()
