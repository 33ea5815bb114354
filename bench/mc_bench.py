"""Managed collision (MCH) in 2D: quality against 1D, and the sync cost of an MC table.

1. Quality: the trainer on ``configs/tiny_cpu.yaml`` with ``model.managed_collision.enabled``
   (every table behind an LFU MCH module, synthetic raw ids from a space 10x each table,
   Zipf), world 4: 1D (one group of 4) versus 2D (L=2, 2 replicas) synced every 1 and 16
   steps. Same data, same MC module; eval AUC compared.
2. Sync cost: one row-wise table of ``rows x dim`` (row-wise AdaGrad), plain EBC versus
   MC-EBC of the same size, world 4, L=2. Each rank trains a step on its own Zipf batch
   (so the MC replicas' identities diverge), then ``model.sync()`` is timed; the two models
   alternate, repeated; bytes are what ``SyncReport`` counts.

Writes ``bench/results/mc.json`` and the ``managed_collision`` section of ``bench/RESULTS.md``.
Usage: ``.venv/bin/python bench/mc_bench.py [--steps 800] [--rows 20000] [--repeats 15]``.
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
from bench_util import machine_note, rendezvous, spawn, stats, write_section
from quality import _worker

HERE = os.path.dirname(os.path.abspath(__file__))
MC = ["model.managed_collision.enabled=true"]


def quality(
    steps: int, eval_batches: int, kind: str = "mch", seed: int = 0
) -> list[dict[str, Any]]:
    common = [
        *MC,
        f"data.seed={seed}",
        f"model.init_seed={seed}",
        f"model.managed_collision.kind={kind}",
        f"train.steps={steps}",
        "train.eval_every=0",
        f"train.eval_batches={eval_batches}",
        f"train.log_every={steps}",
        "train.progress_bar=false",
        "checkpoint.every=0",
    ]
    where = rendezvous()
    with tempfile.TemporaryDirectory() as work:
        plan: list[tuple[str, int | None, list[str]]] = [
            ("1D", None, [*common, "parallel.sharding_group_size=4", f"run_dir={work}/1d"])
        ]
        for n in (1, 16):
            plan.append(
                (
                    "2D",
                    n,
                    [
                        *common,
                        "parallel.sharding_group_size=2",
                        f"parallel.sync.every={n}",
                        f"run_dir={work}/2d_{n}",
                    ],
                )
            )
        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(r, 4, where, plan, results)) for r in range(4)]
        for p in procs:
            p.start()
        rows = [results.get(timeout=1800) for _ in plan]
        for p in procs:
            p.join(timeout=60)
    return rows


def _model(managed: bool, rows: int, dim: int, kind: str = "mch") -> Any:
    import torch
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec import EmbeddingBagCollection
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.mc_embedding_modules import ManagedCollisionEmbeddingBagCollection
    from torchrec.modules.mc_modules import (
        LFU_EvictionPolicy,
        ManagedCollisionCollection,
        MCHManagedCollisionModule,
    )
    from torchrec.optim import RowWiseAdagrad

    configs = [
        EmbeddingBagConfig(name="t", embedding_dim=dim, num_embeddings=rows, feature_names=["f"])
    ]
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("cpu"))
    _apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), {"lr": 0.01})
    if not managed:
        return ebc
    if kind == "zch":
        from torchrec.modules.hash_mc_evictions import (
            HashZchEvictionConfig,
            HashZchEvictionPolicyName,
        )
        from torchrec.modules.hash_mc_modules import HashZchManagedCollisionModule

        policy = HashZchEvictionPolicyName.SINGLE_TTL_EVICTION
        zch = HashZchManagedCollisionModule(
            zch_size=rows,
            device=torch.device("cpu"),
            total_num_buckets=4,
            input_hash_size=rows * 10,
            name="t",
            eviction_policy_name=policy,
            eviction_config=HashZchEvictionConfig(features=["f"], single_ttl=1),
        )
        mcc = ManagedCollisionCollection({"t": zch}, embedding_configs=configs)
        return ManagedCollisionEmbeddingBagCollection(ebc, mcc)
    mch = MCHManagedCollisionModule(
        zch_size=rows,
        device=torch.device("cpu"),
        eviction_policy=LFU_EvictionPolicy(),
        eviction_interval=1,
        input_hash_size=rows * 10,
        buckets=4,
    )
    mcc = ManagedCollisionCollection(
        managed_collision_modules={"t": mch}, embedding_configs=configs
    )
    return ManagedCollisionEmbeddingBagCollection(ebc, mcc)


def _batch(step: int, rows: int, batch: int, managed: bool) -> Any:
    import torch
    import torch.distributed as dist
    from torchrec import KeyedJaggedTensor

    gen = torch.Generator().manual_seed(step * 31 + dist.get_rank())
    u = torch.rand(batch * 4, generator=gen)
    ids = ((rows * 10) ** u).long().clamp(max=rows * 10 - 1)  # log-uniform: Zipf-like
    ids = ids if managed else ids % rows  # a plain table reads its rows directly
    return KeyedJaggedTensor.from_lengths_sync(
        keys=["f"], values=ids, lengths=torch.full((batch,), 4, dtype=torch.int32)
    )


def measure_sync(
    rows: int, dim: int, repeats: int, batch: int, mc_kind: str = "mch"
) -> dict[str, Any]:
    """Alternate plain/MC: one training step on each rank's own batch, then a timed sync."""
    import torch
    import torch.distributed as dist
    from torchrec.distributed.planner.types import ParameterConstraints

    from sparse2d import DMPCollection
    from sparse2d.planner.sharders import default_sharders

    row_wise = {"t": ParameterConstraints(sharding_types=["row_wise"])}
    models = {
        kind: DMPCollection(
            _model(kind == "mc", rows, dim, mc_kind),
            2,
            device="cpu",
            constraints=row_wise,
            sharders=default_sharders(),
        )
        for kind in ("plain", "mc")
    }
    out: dict[str, Any] = {k: {"seconds": [], "bytes": 0} for k in models}
    for step in range(repeats + 1):
        for kind, model in models.items():
            kjt = _batch(step, rows, batch, kind == "mc")
            result = model(kjt)
            pooled = (result[0] if isinstance(result, tuple) else result).values()
            pooled.sum().backward()
            dist.barrier()
            start = time.perf_counter()
            report = model.sync()
            seconds = torch.tensor([time.perf_counter() - start])
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
            if step:  # the first round warms up
                out[kind]["seconds"].append(float(seconds))
                out[kind]["bytes"] = int(report.bytes)
    for kind in models:
        out[kind]["stats"] = stats(out[kind]["seconds"])
    return out


def section(q: list[dict[str, Any]], cost: dict[str, Any], args: Any, note: str) -> str:
    base = next(r for r in q if r["strategy"] == "1D")["eval_auc"]
    zch = args.kind == "zch"
    module = (
        "an MP-ZCH module (`HashZchManagedCollisionModule`, TTL metadata, sparse2d's CPU insert)"
        if zch
        else "an LFU MCH module"
    )
    lines = [
        f"## Managed collision ({'MP-ZCH' if zch else 'MCH'}) in 2D (bench/mc_bench.py)",
        "",
        f"Quality: `configs/tiny_cpu.yaml` with `model.managed_collision.enabled=true "
        f"model.managed_collision.kind={args.kind}` ({module} in front of each of the 8 "
        "tables; synthetic raw ids Zipf over 10x each "
        f"table's rows), world 4 gloo CPU, {args.steps} steps, eval on {args.eval_batches} "
        "batches per rank. 1D = one group of 4; 2D = L=2 (2 replicas), identities merged and "
        "rows averaged by id at every sync.",
        "",
        "| run | sync every | eval AUC | AUC - 1D | sync s/step |",
        "|---|---|---|---|---|",
    ]
    for r in q:
        n = "-" if r["every"] is None else str(r["every"])
        lines.append(
            f"| {r['strategy']} | {n} | {r['eval_auc']:.4f} | {r['eval_auc'] - base:+.4f} "
            f"| {r['sync_s_per_step']:.4f} |"
        )
    plain, mc = cost["plain"], cost["mc"]
    ratio = mc["stats"]["median"] / plain["stats"]["median"]
    lines += [
        "",
        f"Sync cost: one row-wise table {args.rows} x {args.dim} fp32 with row-wise AdaGrad, "
        f"world 4, L=2, one step on each rank's own batch ({args.batch} bags of 4 ids) before "
        f"each timed `sync()`, plain and MC alternating, {args.repeats} rounds (slowest rank).",
        "",
        "| table | bytes per sync (this rank) | sync s min | median | max |",
        "|---|---|---|---|---|",
        *(
            f"| {k} | {cost[k]['bytes']} | {cost[k]['stats']['min']:.4f} | "
            f"{cost[k]['stats']['median']:.4f} | {cost[k]['stats']['max']:.4f} |"
            for k in ("plain", "mc")
        ),
        "",
        f"MC / plain: {mc['bytes'] / plain['bytes']:.2f}x bytes, {ratio:.2f}x median time. "
        f"Machine: {note}.",
        "",
        f"Reproduce: `.venv/bin/python bench/mc_bench.py --steps {args.steps} --rows {args.rows} "
        f"--repeats {args.repeats}" + (" --kind zch`" if zch else "`"),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--eval-batches", type=int, default=40)
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--kind", choices=["mch", "zch"], default="mch")
    parser.add_argument("--seed", type=int, default=0, help="data and init seed (quality)")
    parser.add_argument("--skip-quality", action="store_true")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    cost = spawn(4, measure_sync, args.rows, args.dim, args.repeats, args.batch, args.kind)
    q = [] if args.skip_quality else quality(args.steps, args.eval_batches, args.kind, args.seed)
    result = {"quality": q, "sync_cost": cost}
    print(json.dumps(result, indent=1))
    if args.no_write or args.skip_quality:
        return 0
    text = section(q, cost, args, machine_note(load))
    print(text)
    suffix = "_zch" if args.kind == "zch" else ""
    with open(os.path.join(HERE, "results", f"mc{suffix}.json"), "w") as f:
        json.dump(result, f, indent=1)
    marker = {"": "managed_collision", "_zch": "managed_collision_zch"}[suffix]  # RESULTS.md
    write_section(text, marker)
    return 0


if __name__ == "__main__":
    sys.exit(main())
