"""Folding a replica sync into DDP's all-reduce vs a separate replica all-reduce, by size.

World 4 gloo CPU ranks, L=2. *separate*: what an unfolded sync adds to a step: DDP's
world all-reduce of a 16 KB bucket (the main job's dense gradients), then a replica-group
all-reduce of this rank's shard (X / L bytes). *folded*: one world all-reduce of
16 KB + X (every replica group's slot; ``sparse2d.sync.ddp.fold``). X is the region: all
shards of one sharding group. Interleaved repetitions, slowest rank, medians. Where
*folded* costs less, one rendezvous saved outweighs sending L times the bytes to T ranks;
``sparse2d.sync.ddp.fold.FOLD_MAX_BYTES`` is set well below the crossover.

Run: ``PYTHONPATH=. .venv/bin/python bench/fold_bench.py`` (about 1 minute). Writes the
``fold`` section of ``bench/RESULTS.md`` and ``bench/results/fold.json``.
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
WORLD, L, BUCKET = 4, 2, 16 << 10
SIZES_KB = (256, 1024, 4096, 16384)


def fold_rank(sizes_kb: list[int], reps: int) -> dict[str, Any]:
    """Per size: seconds per step of both ways (slowest rank per repetition)."""
    rank = dist.get_rank()
    groups = [dist.new_group(list(range(g, g + L))) for g in range(0, WORLD, L)]
    replica = groups[rank // L]
    rows = []
    for kb in sizes_kb:
        region = kb << 10
        bucket = torch.ones(BUCKET // 4)
        shard = torch.ones(region // L // 4)
        folded = torch.ones((BUCKET + region) // 4)
        ways = {
            "separate": [(bucket, None), (shard, replica)],
            "folded": [(folded, None)],
        }
        times: dict[str, list[float]] = {name: [] for name in ways}
        for rep in range(reps + 1):  # repetition 0 warms up
            order = list(ways) if rep % 2 else list(reversed(ways))
            for name in order:
                dist.barrier()
                begin = time.perf_counter()
                for _ in range(10):
                    for tensor, group in ways[name]:
                        dist.all_reduce(tensor, group=group)
                elapsed = torch.tensor((time.perf_counter() - begin) / 10, dtype=torch.float64)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                if rep:
                    times[name].append(float(elapsed))
        row: dict[str, Any] = {"region_kb": kb}
        row.update({name: stats(t) for name, t in times.items()})
        row["ratio"] = row["folded"]["median"] / row["separate"]["median"]
        rows.append(row)
    return {"rows": rows}


def _markdown(r: dict[str, Any], args: argparse.Namespace, wall: float) -> str:
    from sparse2d.sync.ddp.fold import FOLD_MAX_BYTES

    return "\n".join(
        [
            "## Fold: a replica sync inside DDP's all-reduce vs its own all-reduce",
            "",
            f"`bench/fold_bench.py` — world {WORLD} gloo CPU ranks, L={L}; *separate* = DDP's "
            f"world all-reduce of a {BUCKET >> 10} KB bucket, then a replica all-reduce of the "
            f"rank's shard (region / L); *folded* = one world all-reduce of bucket + region. "
            f"{args.reps} interleaved repetitions of 10, slowest rank, medians. {args.machine}. "
            f"Wall {wall:.0f} s.",
            "",
            "| region (all shards) | separate ms | folded ms | folded / separate |",
            "|---:|---:|---:|---:|",
            *(
                f"| {row['region_kb'] / 1024:g} MB | {1e3 * row['separate']['median']:.2f} | "
                f"{1e3 * row['folded']['median']:.2f} | {row['ratio']:.2f} |"
                for row in r["rows"]
            ),
            "",
            f"Folding is used up to `FOLD_MAX_BYTES` = {FOLD_MAX_BYTES / (1 << 20):g} MB "
            "(the main job's region: 0.5 MB), well below the crossover.",
            "",
            f"Reproduce: `PYTHONPATH=. .venv/bin/python bench/fold_bench.py --reps {args.reps}`.",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES_KB), help="KB")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-results-md", action="store_true", help="do not edit RESULTS.md")
    args = parser.parse_args()
    result, wall = timed(args, spawn, WORLD, fold_rank, args.sizes, args.reps)
    publish(args, result, _markdown(result, args, wall), "fold.json", "fold")


if __name__ == "__main__":
    main()
