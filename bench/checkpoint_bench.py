"""Checkpoint cost: bytes written with replica dedup vs without, and save/load seconds.

Spawns ``--world`` gloo CPU ranks, builds a ``DMPCollection`` (group ``--group``) with
``--tables`` table-wise tables of ``--rows`` x ``--dim`` fp32 and row-wise Adagrad,
then times (max over ranks, median of ``--repeat``):

* ``sparse2d dedup``: ``sparse2d.checkpoint.save`` (only replica-rank 0 writes shards);
* ``naive``: the same state dict with every replica writing its own copy under its own
  keys (what per-rank ``torch.save`` or any replica-unaware writer stores);
* ``torchrec state_dict``: ``dcp.save(model.state_dict())`` (weights only; DCP's planner
  dedups the identical replicated chunks itself);
* ``load`` into the same layout and into a different group size (resharding).

Usage: ``python bench/checkpoint_bench.py [--write]`` (``--write`` updates bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from functools import partial

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from bench_util import init_gloo, meta_ebc, rendezvous, rendezvous_env, write_section
from torch.distributed.checkpoint import FileSystemWriter


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def _timed(fn) -> float:
    dist.barrier()
    start = time.perf_counter()
    fn()
    dist.barrier()
    took = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return float(took)


def _worker(rank: int, args: argparse.Namespace, where: str, root: str, out: mp.Queue) -> None:
    rendezvous_env(rank, args.world, where)
    torch.set_num_threads(1)
    init_gloo(1800)
    from torchrec.distributed.planner.types import ParameterConstraints

    from sparse2d import DMPCollection
    from sparse2d.checkpoint import build_save_state, load, save

    table_wise = ParameterConstraints(sharding_types=["table_wise"], min_partition=4)
    constraints = {f"t{i}": table_wise for i in range(args.tables)}

    def make(group: int) -> DMPCollection:
        module = meta_ebc(args.tables, args.rows, args.dim)
        return DMPCollection(module, group, device="cpu", constraints=constraints)

    model = make(args.group)
    results: dict[str, list[float]] = {}
    sizes: dict[str, int] = {}
    variants = {
        "sparse2d dedup": lambda d, m: save(d, m, step=0),
        "naive (every replica)": lambda d, m: dcp.save(
            build_save_state(m, dedup=False), storage_writer=FileSystemWriter(d)
        ),
        "torchrec state_dict": lambda d, m: dcp.save(
            m.state_dict(), storage_writer=FileSystemWriter(d)
        ),
    }
    for i in range(args.repeat):
        for name, fn in variants.items():
            target = os.path.join(root, f"{name.split()[0]}-{i}")
            seconds = _timed(partial(fn, target, model))
            results.setdefault(f"save: {name}", []).append(seconds)
            sizes[name] = _dir_bytes(target)
    keep = os.path.join(root, "sparse2d-0")
    for _ in range(args.repeat):
        seconds = _timed(partial(load, keep, model))
        results.setdefault(f"load: same layout (L={args.group})", []).append(seconds)
    del model
    other = make(args.reshard_group)
    for _ in range(args.repeat):
        seconds = _timed(partial(load, keep, other))
        results.setdefault(f"load: resharded (L={args.reshard_group})", []).append(seconds)
    if rank == 0:
        out.put(({k: statistics.median(v) for k, v in results.items()}, sizes))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--group", type=int, default=2)
    parser.add_argument("--reshard-group", type=int, default=4)
    parser.add_argument("--tables", type=int, default=8)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--write", action="store_true", help="update its bench/RESULTS.md section")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="ckpt_bench_", dir=args.dir)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    where = rendezvous()
    procs = [
        ctx.Process(target=_worker, args=(r, args, where, root, out)) for r in range(args.world)
    ]
    for p in procs:
        p.start()
    times, sizes = out.get(timeout=3600)
    for p in procs:
        p.join()
    shutil.rmtree(root, ignore_errors=True)
    table_mb = args.tables * args.rows * args.dim * 4 / 1e6
    lines = [
        "",
        "## Checkpoint: replica dedup, save/load time (bench/checkpoint_bench.py)",
        "",
        f"{args.tables} table-wise tables x {args.rows} x {args.dim} fp32 ({table_mb:.0f} MB "
        f"of weights, plus row-wise Adagrad state), world {args.world} gloo CPU ranks, "
        f"L={args.group} ({args.world // args.group} replicas), local disk, median of "
        f"{args.repeat}, max over ranks, 2 CPU cores: seconds vary with other load on the "
        f"machine; bytes are exact.",
        "",
        "| what | bytes written | seconds |",
        "|---|---:|---:|",
    ]
    for name, size in sizes.items():
        lines.append(f"| save: {name} | {size / 1e6:.1f} MB | {times[f'save: {name}']:.2f} |")
    for name, seconds in times.items():
        if name.startswith("load"):
            lines.append(f"| {name} | - | {seconds:.2f} |")
    naive, dedup = sizes["naive (every replica)"], sizes["sparse2d dedup"]
    plain = sizes["torchrec state_dict"]
    lines += [
        "",
        f"A checkpoint writes {dedup / plain:.2f}x the bytes of a plain "
        f"`dcp.save(model.state_dict())` ({dedup / 1e6:.1f} vs {plain / 1e6:.1f} MB: DCP's "
        "planner already drops identical replicated chunks, and that row is weights only: "
        "ours adds the fused optimizer state), and "
        f"{dedup / naive:.2f}x the bytes of every replica writing its copy under its own keys.",
        "",
        "Reproduce: `PYTHONPATH=. .venv/bin/python bench/checkpoint_bench.py --write` (about 2 min).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        write_section(text, "checkpoint")


if __name__ == "__main__":
    main()
