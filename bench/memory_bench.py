"""Embedding memory per rank vs the 1/L theory, and peak RSS, per sharding group size L.

World 4 gloo CPU ranks, a fresh set of processes per L (so peak RSS is that L's
alone). ``TABLES`` table-wise tables of ``rows x 64`` fp32 with row-wise AdaGrad
(one fp32 accumulator per row). *embedding bytes* = this rank's weights plus
every fused optimizer state (read from the FBGEMM buffers); *theory* = total / L
(every group holds one full copy, split over L ranks); *tracking* = the
touched-row stamps of the default ``auto`` engine (4 bytes per local row); *RSS
model* = peak RSS minus the RSS after imports, before the model was built.

Run: ``.venv/bin/python bench/memory_bench.py`` (about 1 minute). Writes the
``memory`` section of ``bench/RESULTS.md`` and ``bench/results/memory.json``.
"""

from __future__ import annotations

import argparse
import resource
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from bench_util import RESULTS_DIR, publish, spawn, timed

HERE = Path(__file__).resolve().parent
WORLD, DIM = 4, 64


def _rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def memory_rank(size: int, tables: int, rows: int) -> list[dict[str, Any]]:
    """On every rank: embedding bytes held and peak RSS with sharding groups of ``size``."""
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.optim import RowWiseAdagrad

    from sparse2d import DMPCollection
    from sparse2d.sync.policy import SyncOptions

    before = _rss()
    names = [f"t{i}" for i in range(tables)]
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(name=n, embedding_dim=DIM, num_embeddings=rows, feature_names=[n])
            for n in names
        ],
        device=torch.device("meta"),
    )
    module = nn.ModuleDict({"ebc": ebc})
    _apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), {"lr": 0.01})
    model = DMPCollection(
        module,
        size,
        device="cpu",
        sync_options=SyncOptions(engine="auto"),
        init_data_parallel=False,
        constraints={n: ParameterConstraints(sharding_types=["table_wise"]) for n in names},
    )
    shards = model.shard_states
    weights = sum(s.weight.numel() * s.weight.element_size() for s in shards)
    states = sum(t.numel() * t.element_size() for s in shards for t in s.optimizer_states)
    tracking = sum(s.rows for s in shards) * 4 if model.num_replicas > 1 else 0
    total = tables * rows * (DIM * 4 + 4)
    mine = {
        "L": size,
        "rank": dist.get_rank(),
        "weights": weights,
        "states": states,
        "tracking": tracking,
        "theory": total / size,
        "total": total,
        "peak_rss": _rss(),
        "rss_model": _rss() - before,
    }
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    model.sync_policy.close()
    return every


def _markdown(results: list[list[dict[str, Any]]], args: argparse.Namespace, wall: float) -> str:
    mb = 1e6
    lines = [
        "## Memory: embedding bytes per rank vs total / L, and peak RSS (bench/memory_bench.py)",
        "",
        f"World {WORLD} gloo CPU ranks, fresh processes per L, {args.tables} table-wise tables of "
        f"{args.rows} x {DIM} fp32, row-wise AdaGrad (total weights + state "
        f"{results[0][0]['total'] / mb:.1f} MB). Max over ranks. Wall {wall:.0f} s.",
        "",
        "| L | replicas | weights MB | optimizer state MB | embedding MB | theory total/L MB | "
        "embedding / theory | tracking MB | peak RSS MB | RSS from the model MB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for ranks in results:
        worst = max(ranks, key=lambda r: r["weights"] + r["states"])
        emb = worst["weights"] + worst["states"]
        lines.append(
            f"| {worst['L']} | {WORLD // worst['L']} | {worst['weights'] / mb:.1f} | "
            f"{worst['states'] / mb:.2f} | {emb / mb:.1f} | {worst['theory'] / mb:.1f} | "
            f"{emb / worst['theory']:.3f} | {max(r['tracking'] for r in ranks) / mb:.2f} | "
            f"{max(r['peak_rss'] for r in ranks) / mb:.0f} | "
            f"{max(r['rss_model'] for r in ranks) / mb:.0f} |"
        )
    lines += [
        "",
        "Embedding bytes follow total/L exactly when the L ranks split the tables evenly (TW "
        "with tables divisible by L). Peak RSS adds the Python/TorchRec runtime and transient "
        "copies made while the tables are materialized and replicas aligned.",
        "",
        f"Reproduce: `PYTHONPATH=. .venv/bin/python bench/memory_bench.py --tables {args.tables} "
        f"--rows {args.rows}`.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--tables", type=int, default=8)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-results-md", action="store_true", help="do not edit RESULTS.md")
    args = parser.parse_args()

    def every_size() -> list[Any]:
        return [spawn(WORLD, memory_rank, size, args.tables, args.rows) for size in args.sizes]

    results, wall = timed(args, every_size)
    publish(args, results, _markdown(results, args, wall), "memory.json", "memory")


if __name__ == "__main__":
    main()
