"""Cost of the sync NaN/inf guard (``SyncOptions.check_finite``) relative to the sync, in one run.

World 4 gloo CPU ranks, groups of L=2 (2 replicas), table-wise tables with row-wise
AdaGrad. For each case, two ``SyncPolicy`` objects over the same shards, one with the
guard and one without, are timed alternately (``sync_now`` after one real training step,
so the sparse engine has touched rows to send); medians over repetitions, max over ranks.
Also timed alone: the guard's local scan of the payload and its world flag all-reduce.

Cases: ``large``: 4 tables x 100k x 64 (dense engine: ~100 MB per rank);
``tiny``: 8 tables x 2000 x 16 (the ``configs/tiny_cpu.yaml`` scale, ``auto`` engine),
where the flag all-reduce's latency, not the scan, is the cost.
Writes the finite-bench section of ``bench/RESULTS.md``.
Usage: ``.venv/bin/python bench/finite_bench.py [--repeats 9]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import torch.multiprocessing as mp
from bench_util import init_gloo, rendezvous, rendezvous_env, write_section

CASES = {
    "large (4 x 100k x 64, dense)": {"tables": 4, "rows": 100_000, "dim": 64, "engine": "dense"},
    "tiny (8 x 2000 x 16, auto)": {"tables": 8, "rows": 2000, "dim": 16, "engine": "auto"},
}
BATCH = 128


def _model(case: dict) -> Any:
    import torch
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec import EmbeddingBagCollection
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.optim import RowWiseAdagrad

    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name=f"t{i}",
                embedding_dim=case["dim"],
                num_embeddings=case["rows"],
                feature_names=[f"f{i}"],
            )
            for i in range(case["tables"])
        ],
        device=torch.device("meta"),
    )
    _apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), {"lr": 0.01})
    return ebc


def _step(model: Any, case: dict, step: int, rank: int) -> None:
    import torch
    from torchrec import KeyedJaggedTensor

    gen = torch.Generator().manual_seed(step * 101 + rank)
    lengths = torch.randint(1, 4, (case["tables"] * BATCH,), generator=gen)
    values = torch.randint(0, case["rows"], (int(lengths.sum()),), generator=gen)
    keys = [f"f{i}" for i in range(case["tables"])]
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths)
    model(kjt).values().square().mean().backward()


def _worker(rank: int, world: int, where: str, repeats: int, out: Any) -> None:
    rendezvous_env(rank, world, where)
    import torch
    import torch.distributed as dist
    from torchrec.distributed.planner.types import ParameterConstraints

    from sparse2d import DMPCollection
    from sparse2d.sync.guard import FiniteGuard, all_finite
    from sparse2d.sync.policy import SyncOptions, SyncPolicy

    torch.set_num_threads(1)
    init_gloo(600)
    results: dict[str, dict[str, float]] = {}
    step = 0
    for name, case in CASES.items():
        constraints = {
            f"t{i}": ParameterConstraints(sharding_types=["table_wise"])
            for i in range(case["tables"])
        }
        model = DMPCollection(_model(case), 2, device="cpu", constraints=constraints)
        shards, pg, g = model.shard_states, model.replica_pg, model.num_replicas
        policies = {
            on: SyncPolicy(shards, pg, g, SyncOptions(engine=case["engine"], check_finite=on))
            for on in (False, True)
        }
        guard = FiniteGuard(shards, dist.group.WORLD)
        times: dict[str, list[float]] = {"off": [], "on": [], "scan": [], "flags": []}
        for rep in range(repeats + 1):
            for on in (False, True) if rep % 2 else (True, False):
                _step(model, case, step, rank)
                step += 1
                dist.barrier()
                seconds = policies[on].sync_now().seconds
                if rep:  # the first repetition warms up
                    times["on" if on else "off"].append(seconds)
            payload = policies[True].engine.payload(weights=True, states=True)
            dist.barrier()
            begin = time.perf_counter()
            all(all_finite(b) for b in payload.buffers)
            scanned = time.perf_counter()
            guard.start(step, [], weights=True, states=True).wait()
            if rep:
                times["scan"].append(scanned - begin)
                times["flags"].append(time.perf_counter() - scanned)
        results[name] = {k: statistics.median(v) for k, v in times.items()}
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, results)
    if rank == 0:
        out.put(gathered)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    world = 4
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    where = rendezvous()
    procs = [
        ctx.Process(target=_worker, args=(r, world, where, args.repeats, out)) for r in range(world)
    ]
    for p in procs:
        p.start()
    gathered = out.get(timeout=1800)
    for p in procs:
        p.join()
    lines = [
        "## Sync NaN/inf guard cost (`SyncOptions.check_finite`)",
        "",
        f"Command: `.venv/bin/python bench/finite_bench.py --repeats {args.repeats}` "
        "(world 4, gloo CPU, L=2, row-wise AdaGrad; guard on/off timed alternately in one run, "
        "medians over repetitions, max over ranks; 2 shared CPU cores loaded by other work, so "
        "absolute times are noisy, read the ratios).",
        "",
        "| case | sync off (ms) | sync on (ms) | on/off - 1 | scan (ms) | scan / sync off "
        "| blocking flag all-reduce alone (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in CASES:
        m = {k: max(g[name][k] for g in gathered) for k in gathered[0][name]}
        lines.append(
            f"| {name} | {m['off'] * 1e3:.2f} | {m['on'] * 1e3:.2f} | "
            f"{(m['on'] / m['off'] - 1) * 100:+.1f}% | {m['scan'] * 1e3:.2f} | "
            f"{m['scan'] / m['off'] * 100:.1f}% | {m['flags'] * 1e3:.2f} |"
        )
    lines += [
        "",
        "The guard costs a scan (one `sum` per payload buffer: bandwidth, a few % of a dense "
        "sync) and one vote (a world all-reduce of one int per rank), started before the "
        "payload all-reduce and waited for before the write-back, so it overlaps the transfer. "
        "On this oversubscribed box (4 ranks, 2 shared cores) every collective costs "
        "milliseconds of scheduling latency, so a small latency-bound sync (`tiny`, a few "
        "collectives of a few ms each) pays roughly one collective more: the 3% goal holds for "
        "bandwidth-bound syncs and is missed for tiny ones here. Amortize with `sync.every` or "
        "turn the guard off (`check_finite=False`) when a sync is pure latency.",
    ]
    text = "\n".join(lines)
    print(text)
    write_section(text, "finite-bench")
    return 0


if __name__ == "__main__":
    sys.exit(main())
