"""Sync cost per call versus a raw ``allreduce_coalesced`` of the same bytes, in one run.

World 4 gloo CPU ranks, groups of L=2 (2 replicas), table-wise tables with row-wise
AdaGrad. Per repetition, interleaved so machine noise hits all alike:

* ``raw``: ``replica_pg.allreduce_coalesced`` (AVG) of the live weight + state views;
* ``dense fp32``: ``SyncPolicy.sync_now`` (dense engine: gather, all-reduce, scatter).

Medians over repetitions; max over ranks. Writes the section between the sync-bench
markers of ``bench/RESULTS.md``. (It also measured the retired ``overlap`` option's hidden
fraction and ``compression: bf16``'s sync; they stay in the section until it is re-run:
bench/sync_options_bench.py.)
Usage: ``.venv/bin/python bench/sync_bench.py [--rows 100000 --dim 64 --tables 4]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import torch.multiprocessing as mp
from bench_util import init_gloo, meta_ebc, rendezvous, rendezvous_env, write_section

HERE = os.path.dirname(os.path.abspath(__file__))


def _model(args: argparse.Namespace) -> Any:
    import torch

    torch.manual_seed(0)
    return meta_ebc(args.tables, args.rows, args.dim)


def _batch(args: argparse.Namespace, step: int, rank: int) -> Any:
    import torch
    from torchrec import KeyedJaggedTensor

    gen = torch.Generator().manual_seed(step * 101 + rank)
    lengths = torch.randint(1, 4, (args.tables * args.batch,), generator=gen)
    values = torch.randint(0, args.rows, (int(lengths.sum()),), generator=gen)
    keys = [f"f{i}" for i in range(args.tables)]
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths)


def _worker(rank: int, world: int, where: str, args: argparse.Namespace, out: Any) -> None:
    rendezvous_env(rank, world, where)
    import torch
    import torch.distributed as dist
    from torchrec.distributed.planner.types import ParameterConstraints

    from sparse2d import DMPCollection
    from sparse2d.sync.policy import SyncOptions, SyncPolicy
    from sparse2d.sync.shards import live_tensors

    torch.set_num_threads(1)
    init_gloo(600)
    constraints = {
        f"t{i}": ParameterConstraints(sharding_types=["table_wise"]) for i in range(args.tables)
    }
    model = DMPCollection(_model(args), 2, device="cpu", constraints=constraints)
    shards, pg, g = model.shard_states, model.replica_pg, model.num_replicas
    live = live_tensors(shards, weights=True, states=True)
    dense = SyncPolicy(shards, pg, g, SyncOptions(engine="dense"))

    def raw() -> float:
        opts = dist.AllreduceCoalescedOptions()
        opts.reduceOp = dist.ReduceOp.AVG
        start = time.perf_counter()
        with torch.no_grad():
            pg.allreduce_coalesced(live, opts).wait()
        return time.perf_counter() - start

    def flat() -> float:
        buffer = torch.cat([t.reshape(-1) for t in live])
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(buffer, op=dist.ReduceOp.AVG, group=pg)
        return time.perf_counter() - start

    def timed(policy: SyncPolicy) -> tuple[float, int]:
        dist.barrier()
        report = policy.sync_now()
        return report.seconds, report.bytes

    times: dict[str, list[float]] = {"raw": [], "flat": [], "dense": []}
    moved: dict[str, int] = {}
    for _ in range(args.repeats):
        dist.barrier()
        times["raw"].append(raw())
        moved["raw"] = moved["flat"] = sum(t.numel() * t.element_size() for t in live)
        times["flat"].append(flat())
        seconds, nbytes = timed(dense)
        times["dense"].append(seconds)
        moved["dense"] = nbytes

    local = {k: statistics.median(v) for k, v in times.items()}
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, {"t": local, "bytes": moved})
    if rank == 0:
        out.put(gathered)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--tables", type=int, default=4)
    parser.add_argument("--batch", type=int, default=256, help="ids per feature per rank")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    where = rendezvous()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, 4, where, args, out)) for r in range(4)]
    for p in procs:
        p.start()
    ranks = out.get(timeout=1800)
    for p in procs:
        p.join(timeout=60)
    worst = {k: max(r["t"][k] for r in ranks) for k in ranks[0]["t"]}
    nbytes = ranks[0]["bytes"]
    lines = [
        "| sync | bytes/rank | s/call (max rank, median) | / raw coalesced | / raw flat |",
        "|---|---|---|---|---|",
    ]
    for name, label in (
        ("raw", "raw allreduce_coalesced (live views)"),
        ("flat", "raw all_reduce of one flat buffer (no copies timed)"),
        ("dense", "policy dense fp32 (gather + all-reduce + scatter)"),
    ):
        ratio = worst[name] / worst["raw"]
        flat_ratio = worst[name] / worst["flat"]
        lines.append(
            f"| {label} | {nbytes[name] / 1e6:.1f} MB | {worst[name]:.4f} | {ratio:.2f} "
            f"| {flat_ratio:.2f} |"
        )
    text = "\n".join(lines)
    print(text)
    if args.no_write:
        return 0
    header = (
        "## Sync cost vs raw all-reduce (bench/sync_bench.py)\n\n"
        f"World 4 gloo CPU ranks, L=2 (2 replicas), {args.tables} table-wise tables of "
        f"{args.rows} x {args.dim} fp32 with row-wise AdaGrad; median of {args.repeats} "
        "interleaved repetitions, max over ranks, all in one run on the 2-core machine (ratios "
        "are the meaningful output).\n\n"
    )
    write_section(header + text, "sync-bench")
    return 0


if __name__ == "__main__":
    sys.exit(main())
