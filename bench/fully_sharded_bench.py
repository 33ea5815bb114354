"""FULLY_SHARDED vs DEFAULT: resident embedding bytes, RSS, and step time, world 4 gloo CPU.

Memory, one fresh 4-rank world per (strategy, L) so that peak RSS belongs to that case:
train ``--steps`` steps (row-wise AdaGrad, sync every step) and record per rank

* weights at rest: the storage the TBE weight buffers hold between steps (plus, under
  FULLY_SHARDED, this replica's slice), and the same in the forward->backward window;
* states at rest: the same for the fused optimizer-state buffers;
* RSS between steps (``/proc/self/statm``) and peak RSS (``ru_maxrss``), both minus the RSS
  measured right before the model was built (imports and the process group excluded).

Step time: one world per L holding both models, steps interleaved in blocks so machine noise
hits both alike; DEFAULT calls ``sync()`` after every step (the exact baseline). Medians,
max over ranks. Writes its section of ``bench/RESULTS.md``.
Usage: ``.venv/bin/python bench/fully_sharded_bench.py [--rows 50000 --dim 32 --tables 8]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from typing import Any

import torch.multiprocessing as mp
from bench_util import init_gloo, meta_ebc, rendezvous, rendezvous_env, write_section

STRATEGIES = ("DEFAULT", "FULLY_SHARDED")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _model(args: argparse.Namespace, group: int, strategy: str) -> Any:
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import ShardingStrategy

    from sparse2d import DMPCollection

    ebc = meta_ebc(args.tables, args.rows, args.dim)
    kinds = ("table_wise", "row_wise")
    constraints = {
        f"t{i}": ParameterConstraints(sharding_types=[kinds[i % 2]]) for i in range(args.tables)
    }
    return DMPCollection(
        ebc,
        group,
        device="cpu",
        constraints=constraints,
        sharding_strategy=ShardingStrategy[strategy],
    )


def _batch(args: argparse.Namespace, step: int, rank: int) -> Any:
    import torch
    from torchrec import KeyedJaggedTensor

    gen = torch.Generator().manual_seed(step * 101 + rank)
    lengths = torch.randint(1, 4, (args.tables * args.batch,), generator=gen)
    values = torch.randint(0, args.rows, (int(lengths.sum()),), generator=gen)
    keys = [f"f{i}" for i in range(args.tables)]
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths)


def _buffer_bytes(model: Any, window: bool = False) -> tuple[int, int]:
    """(weights, states) bytes the TBE buffers (and FULLY_SHARDED slices) hold now."""
    fs = model.fully_sharded
    if fs is not None:
        return fs.resident_bytes(True, False), fs.resident_bytes(False, True)
    tbes = {id(s.kernel): s.kernel for s in model.shard_states}.values()
    weights = sum(t.weights_host.untyped_storage().nbytes() for t in tbes)
    states = sum(t.momentum1_host.untyped_storage().nbytes() for t in tbes)
    return weights, states


def _step(model: Any, args: argparse.Namespace, step: int, rank: int, probe: list | None) -> None:
    loss = model(_batch(args, step, rank)).values().square().mean()
    if probe is not None:
        probe.append(_buffer_bytes(model)[0])
    loss.backward()
    model.sync()


def _worker(rank: int, world: int, where: str, job: tuple, args: argparse.Namespace, out) -> None:
    rendezvous_env(rank, world, where)
    import torch
    import torch.distributed as dist
    import torchrec.distributed.planner  # noqa: F401  (imports out of the RSS baseline)

    import sparse2d.core.collection  # noqa: F401

    torch.set_num_threads(1)
    init_gloo(900)
    kind, group, strategies = job
    base = _rss()
    models = {s: _model(args, group, s) for s in strategies}
    result: dict[str, Any] = {}
    if kind == "memory":
        (strategy,) = strategies
        model, window = models[strategy], []
        for step in range(args.steps):
            _step(model, args, step, rank, window)
        weights, states = _buffer_bytes(model)
        result = {
            "weights": weights,
            "states": states,
            "window": max(window),
            "rss": _rss() - base,
            "peak": _peak_rss() - base,
            "G": model.num_replicas,
        }
    else:
        times: dict[str, list[float]] = {s: [] for s in strategies}
        step = 0
        for block in range(args.blocks + 1):
            for strategy, model in models.items():
                for _ in range(args.block_steps):
                    dist.barrier()
                    start = time.perf_counter()
                    _step(model, args, step, rank, None)
                    if block:  # block 0 warms up
                        times[strategy].append(time.perf_counter() - start)
                    step += 1
        result = {s: statistics.median(v) for s, v in times.items()}
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, result)
    if rank == 0:
        out.put(gathered)
    dist.destroy_process_group()


def _run(job: tuple, args: argparse.Namespace) -> list[dict[str, Any]]:
    ctx = mp.get_context("spawn")
    out, where = ctx.Queue(), rendezvous()
    procs = [ctx.Process(target=_worker, args=(r, 4, where, job, args, out)) for r in range(4)]
    for p in procs:
        p.start()
    ranks = out.get(timeout=1800)
    for p in procs:
        p.join(timeout=60)
    return ranks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--tables", type=int, default=8)
    parser.add_argument("--batch", type=int, default=256, help="ids per feature per rank")
    parser.add_argument("--steps", type=int, default=4, help="steps of each memory run")
    parser.add_argument("--blocks", type=int, default=4, help="timed blocks per strategy")
    parser.add_argument("--block-steps", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    mb = 1e6
    lines = [
        "| L | G | strategy | weights at rest MB | / DEFAULT | goal 1/G+5% | fwd->bwd window MB "
        "| states at rest MB | RSS between steps MB | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    timing = [
        "| L | G | DEFAULT + sync() s/step | FULLY_SHARDED s/step | ratio |",
        "|---|---|---|---|---|",
    ]
    for group in (2, 1):
        mem = {s: _run(("memory", group, (s,)), args) for s in STRATEGIES}
        g = mem["DEFAULT"][0]["G"]
        for s in STRATEGIES:
            w = max(r["weights"] for r in mem[s])
            ratio = w / max(r["weights"] for r in mem["DEFAULT"])
            goal = "yes" if ratio <= 1 / g + 0.05 else "no"
            lines.append(
                f"| {group} | {g} | {s} | {w / mb:.2f} | {ratio:.3f} | "
                f"{goal if s != 'DEFAULT' else ''} | {max(r['window'] for r in mem[s]) / mb:.2f} "
                f"| {max(r['states'] for r in mem[s]) / mb:.3f} "
                f"| {max(r['rss'] for r in mem[s]) / mb:.1f} | {max(r['peak'] for r in mem[s]) / mb:.1f} |"
            )
            print(lines[-1], flush=True)
        t = _run(("time", group, STRATEGIES), args)
        d, f = (max(r[s] for r in t) for s in STRATEGIES)
        timing.append(f"| {group} | {g} | {d:.4f} | {f:.4f} | {f / d:.2f} |")
        print(timing[-1], flush=True)
    text = "\n".join(lines + [""] + timing)
    if args.no_write:
        return 0
    command = "python bench/fully_sharded_bench.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    header = (
        "## FULLY_SHARDED vs DEFAULT: memory and step time (bench/fully_sharded_bench.py)\n\n"
        f"`{command.strip()}`. World 4 gloo CPU ranks, {args.tables} tables of {args.rows} x "
        f"{args.dim} fp32 (half table-wise, half row-wise), row-wise AdaGrad, {args.batch} ids "
        "per feature per rank. Max over ranks. Memory: one fresh world per row; RSS columns are "
        "minus the RSS before the model was built. Weights = storage of the TBE weight buffers "
        "(+ this replica's slice under FULLY_SHARDED). Step time: both models in one world, "
        f"{args.blocks} interleaved blocks of {args.block_steps} steps, median; the 2-core "
        "machine is shared with other jobs, so only the ratio is meaningful.\n\n"
    )
    write_section(header + text, "fully-sharded-bench")
    return 0


if __name__ == "__main__":
    sys.exit(main())
