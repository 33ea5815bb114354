"""Sync cost per call versus a raw ``allreduce_coalesced`` of the same bytes, in one run.

World 4 gloo CPU ranks, groups of L=2 (2 replicas), table-wise tables with row-wise
AdaGrad. Per repetition, interleaved so machine noise hits all alike:

* ``raw``: ``replica_pg.allreduce_coalesced`` (AVG) of the live weight + state views;
* ``dense fp32``: ``SyncPolicy.sync_now`` (dense engine: gather, all-reduce, scatter).

Medians over repetitions; max over ranks. Writes ``bench/results/sync_bench.json`` and the
section between the sync-bench markers of ``bench/RESULTS.md``; ``--render`` rewrites the
section from the JSON. The stored run also measured the retired ``overlap`` option's hidden
fraction and ``compression: bf16``'s sync (issue 56, section sync-options): the JSON keeps
them under ``retired`` and the section marks them as their retirement's evidence; a new run
cannot measure them and drops them.
Usage: ``.venv/bin/python bench/sync_bench.py [--rows 100000 --dim 64 --tables 4]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import torch.multiprocessing as mp
from bench_util import (
    RESULTS_DIR,
    init_gloo,
    meta_ebc,
    rendezvous,
    rendezvous_env,
    stored_stamp,
    write_section,
)

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


LIVE = (
    ("raw", "raw allreduce_coalesced (live views)"),
    ("flat", "raw all_reduce of one flat buffer (no copies timed)"),
    ("dense", "policy dense fp32 (gather + all-reduce + scatter)"),
)
STORED = RESULTS_DIR / "sync_bench.json"


def render(result: dict[str, Any]) -> str:
    """The section from a run's JSON: each sync against the raw all-reduces, then the retired
    options' rows (when the run holds them), marked as the evidence of their retirement."""
    worst, nbytes = result["worst"], result["bytes"]

    def row(label: str, seconds: float, size: float) -> str:
        return (
            f"| {label} | {size / 1e6:.1f} MB | {seconds:.4f} | {seconds / worst['raw']:.2f} "
            f"| {seconds / worst['flat']:.2f} |"
        )

    lines = [
        "## Sync cost vs raw all-reduce (bench/sync_bench.py)",
        "",
        f"World 4 gloo CPU ranks, L=2 (2 replicas), {result['tables']} table-wise tables of "
        f"{result['rows']} x {result['dim']} fp32 with row-wise AdaGrad; median of "
        f"{result['repeats']} interleaved repetitions, max over ranks, all in one run on the "
        "2-core machine (ratios are the meaningful output).",
        "",
        "| sync | bytes/rank | s/call (max rank, median) | / raw coalesced | / raw flat |",
        "|---|---|---|---|---|",
        *[row(label, worst[name], nbytes[name]) for name, label in LIVE],
    ]
    retired = result.get("retired")
    if retired:
        bf16 = retired["bf16"]
        lines += [
            row("policy bf16 deltas (retired)", bf16["s"], bf16["bytes"]),
            "",
            "| overlap (retired): steps between syncs | compute s | wait s | hidden fraction |",
            "|---|---|---|---|",
            *[
                f"| {r['every']} | {r['compute_s']:.4f} | {r['wait_s']:.4f} | {r['hidden']:.2f} |"
                for r in retired["overlap"]
            ],
            "",
            "Rows marked (retired): `compression: bf16` and `overlap`, measured by this run "
            "before issue 56 retired them (section sync-options): the evidence of their "
            "retirement, not options that run now. Hidden fraction = 1 - wait at the next "
            "sync point / blocking fp32 sync time. " + retired["source"],
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--tables", type=int, default=4)
    parser.add_argument("--batch", type=int, default=256, help="ids per feature per rank")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--render", action="store_true", help="rewrite the section from JSON")
    args = parser.parse_args(argv)
    if args.render:
        write_section(
            render(json.loads(STORED.read_text())),
            "sync-bench",
            stamp=stored_stamp("sync-bench", RESULTS_DIR),
        )
        return 0
    where = rendezvous()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, 4, where, args, out)) for r in range(4)]
    for p in procs:
        p.start()
    ranks = out.get(timeout=1800)
    for p in procs:
        p.join(timeout=60)
    result = {
        "rows": args.rows,
        "dim": args.dim,
        "tables": args.tables,
        "repeats": args.repeats,
        "worst": {k: max(r["t"][k] for r in ranks) for k in ranks[0]["t"]},
        "bytes": ranks[0]["bytes"],
    }
    text = render(result)
    print(text)
    if args.no_write:
        return 0
    STORED.write_text(json.dumps(result, indent=1))
    write_section(text, "sync-bench")
    return 0


if __name__ == "__main__":
    sys.exit(main())
