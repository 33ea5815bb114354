"""Sparse vs dense replica sync: bytes moved and sync time, and the dense crossover.

4 gloo CPU processes, sharding groups of L=2 (two replicas of every shard), two
table-wise tables of ``rows x 64`` fp32 with row-wise Adagrad, batch 512 per rank,
one id per sample per table, ids uniform or Zipf(1.05). For each sync_every, the
ranks train ``every`` steps, then time one sparse sync and one dense sync of the
same state (each after a barrier; the slowest rank counts). The crossover sweep
marks a chosen fraction of every shard's rows as touched (the same rows on both
replicas, so the union is exactly that fraction) and times a never-dense sparse
sync against the dense one.

Run: ``.venv/bin/python bench/sparse_sync_bench.py`` (about 5 minutes on 2 cores).
Writes ``bench/results/sparse_sync.json``, ``bench/results/sparse_sync.png`` and the section of
``bench/RESULTS.md`` between the ``sparse-sync`` markers.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from bench_util import RESULTS_DIR, init_gloo, publish, rendezvous, rendezvous_env, timed
from sparse_sync_report import BATCH, DIM, DISTS, TABLES, WORLD, L, _markdown, _plot

HERE = Path(__file__).resolve().parent
EVERY = (1, 4, 16, 64)
FRACTIONS = (0.001, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0)
ZIPF_S = 1.05
ENGINE_ORDERS = tuple(itertools.permutations(("sparse", "dense", "auto")))
"""All six orders in turn: each engine runs first, last, and right after each other engine
equally often (a sync right after a 260 MB dense one starts with cold caches)."""


class Model(nn.Module):
    def __init__(self, rows: int) -> None:
        super().__init__()
        from torchrec import EmbeddingBagCollection
        from torchrec.modules.embedding_configs import EmbeddingBagConfig

        self.ebc = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(
                    name=f"t{i}", embedding_dim=DIM, num_embeddings=rows, feature_names=[f"f{i}"]
                )
                for i in range(TABLES)
            ],
            device=torch.device("meta"),
        )
        self.head = nn.Linear(DIM * TABLES, 1)

    def forward(self, kjt: Any) -> torch.Tensor:
        pooled = self.ebc(kjt).values()
        return self.head(pooled).squeeze(1)


class Ids:
    """Per-(rank, step) ids: uniform, or Zipf(1.05) over a fixed random permutation of rows."""

    def __init__(self, rows: int, dist_name: str) -> None:
        self.rows, self.dist_name = rows, dist_name
        gen = torch.Generator().manual_seed(1234)
        ranks = torch.arange(1, rows + 1, dtype=torch.float64)
        self.cdf = torch.cumsum(ranks.pow(-ZIPF_S), 0)
        self.cdf /= self.cdf[-1].clone()
        self.perm = torch.randperm(rows, generator=gen)

    def sample(self, step: int, rank: int, table: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(step * 7919 + rank * 104729 + table * 13)
        if self.dist_name == "uniform":
            return torch.randint(0, self.rows, (BATCH,), generator=gen)
        u = torch.rand(BATCH, generator=gen, dtype=torch.float64)
        return self.perm[torch.searchsorted(self.cdf, u).clamp_(max=self.rows - 1)]


def _batch(ids: Ids, step: int, rank: int) -> Any:
    from torchrec import KeyedJaggedTensor

    return KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f{i}" for i in range(TABLES)],
        values=torch.cat([ids.sample(step, rank, i) for i in range(TABLES)]),
        lengths=torch.ones(BATCH * TABLES, dtype=torch.int64),
    )


def _timed_sync(engine: Any, pg: dist.ProcessGroup) -> tuple[float, int, int]:
    """One blocking sync of weights + states; returns (seconds, payload bytes, meta bytes)."""
    dist.barrier()
    start = time.perf_counter()
    with torch.no_grad():
        payload = engine.payload(weights=True, states=True)
        for buffer in payload.buffers:
            dist.all_reduce(buffer, op=dist.ReduceOp.AVG, group=pg)
        payload.scatter(payload.buffers)
    engine.synced(weights=True, states=True)
    seconds = time.perf_counter() - start
    meta = engine.stats.metadata_bytes if hasattr(engine, "stats") else 0
    return seconds, payload.bytes, meta


def _alternate(
    model: Any, opt: Any, engines: dict[str, Any], ids: Ids, rank: int, reps: int, step: int
) -> dict[str, list[float]]:
    """Zipf ids, sync every step: ``reps`` steps, each timing all engines in rotating order."""
    times: dict[str, list[float]] = {name: [] for name in engines}
    times["auto_dense"] = []  # 1.0 where auto ran a dense sync
    orders = list(itertools.permutations(engines))
    for rep in range(reps):
        loss = model(_batch(ids, step + rep, rank)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        for name in orders[rep % len(orders)]:
            times[name].append(_timed_sync(engines[name], pg=engines[name].replica_pg)[0])
        times["auto_dense"].append(float(engines["auto"].mode == "dense"))
    return times


def _run_size(
    rows: int, rank: int, reps: int, everys: tuple[int, ...], ab_reps: int = 0
) -> dict[str, Any]:
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.optim import RowWiseAdagrad
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from sparse2d.core.collection import DMPCollection
    from sparse2d.sync.engines.auto import AutoEngine
    from sparse2d.sync.engines.dense import DenseEngine
    from sparse2d.sync.engines.sparse import SparseEngine

    module = Model(rows)
    _apply_optimizer_in_backward(RowWiseAdagrad, module.ebc.parameters(), {"lr": 0.05})
    constraints = {
        f"t{i}": ParameterConstraints(sharding_types=["table_wise"]) for i in range(TABLES)
    }
    model = DMPCollection(module, L, device="cpu", constraints=constraints)
    dense_opt = torch.optim.SGD(
        [p for _, p in in_backward_optimizer_filter(model.named_parameters())], lr=0.01
    )
    shards, pg = model.shard_states, model.replica_pg
    sparse, dense = SparseEngine(shards, pg), DenseEngine(shards, pg)
    auto = AutoEngine(shards, pg)  # probes the replica group once, like the trainer
    out: dict[str, Any] = {"rows": rows, "runs": [], "sweep": []}
    step = 0
    for dist_name in DISTS if everys else ():
        ids = Ids(rows, dist_name)
        for every in everys:
            for engine in (sparse, auto):  # start the interval from synced replicas
                _timed_sync(engine, pg)
            for rep in range(reps):
                began = time.perf_counter()
                for _ in range(every):
                    loss = model(_batch(ids, step, rank)).square().mean()
                    loss.backward()
                    dense_opt.step()
                    dense_opt.zero_grad()
                    step += 1
                step_s = (time.perf_counter() - began) / every
                timed = {}  # the three engines take turns going first (cache and load effects)
                for name in ENGINE_ORDERS[rep % len(ENGINE_ORDERS)]:
                    engine = {"sparse": sparse, "dense": dense, "auto": auto}[name]
                    timed[name] = _timed_sync(engine, pg)
                    if name == "sparse":
                        fraction = sparse.stats.rows_synced / max(sparse.stats.rows_total, 1)
                (s_sec, s_bytes, s_meta), (d_sec, d_bytes, _) = timed["sparse"], timed["dense"]
                a_sec = timed["auto"][0]
                out["runs"].append(
                    dict(
                        dist=dist_name,
                        every=every,
                        sparse_s=s_sec,
                        dense_s=d_sec,
                        sparse_bytes=s_bytes,
                        meta_bytes=s_meta,
                        dense_bytes=d_bytes,
                        union_fraction=fraction,
                        step_s=step_s,
                        auto_s=a_sec,
                        auto_dense=float(auto.mode == "dense"),
                    )
                )
    twin = SparseEngine(shards, pg)  # A/A controls: the measurement's own noise and bias
    engines = {
        "sparse": sparse,
        "dense": dense,
        "auto": auto,
        "twin": twin,
        "dense_twin": DenseEngine(shards, pg),
    }
    out["ab"] = _alternate(model, dense_opt, engines, Ids(rows, "zipf"), rank, ab_reps, step)
    twin.close()
    sparse.crossover = 1.0  # the sweep times the sparse path even where dense is cheaper
    for fraction in FRACTIONS if everys else ():
        points = []
        for rep in range(reps):
            for i, shard in enumerate(shards):
                gen = torch.Generator().manual_seed(i * 1000 + rep)
                count = round(fraction * shard.rows)
                sparse.tracker.mark_rows(i, torch.randperm(shard.rows, generator=gen)[:count])
            s_sec, s_bytes, s_meta = _timed_sync(sparse, pg)
            d_sec, d_bytes, _ = _timed_sync(dense, pg)
            points.append((s_sec, d_sec))
        s_sec, d_sec = (sorted(p[k] for p in points)[len(points) // 2] for k in (0, 1))
        out["sweep"].append(
            dict(
                fraction=fraction,
                sparse_s=s_sec,
                dense_s=d_sec,
                sparse_bytes=s_bytes + s_meta,
                dense_bytes=d_bytes,
            )
        )
    sparse.close()
    auto.close()
    return out


def _worker(rank: int, where: str, args: argparse.Namespace, queue: Any) -> None:
    rendezvous_env(rank, WORLD, where)
    torch.set_num_threads(1)
    init_gloo(600)
    torch.manual_seed(0)
    results = [
        _run_size(rows, rank, args.reps, tuple(args.every), args.ab_reps) for rows in args.rows
    ]
    gathered: list[Any] = [None] * WORLD
    dist.all_gather_object(gathered, results)
    if rank == 0:
        queue.put(_slowest_rank(gathered))
    dist.destroy_process_group()


def _slowest_rank(per_rank: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per measurement, the max time and bytes over ranks (a sync ends when the last does)."""
    merged = per_rank[0]
    for size_index, size in enumerate(merged):
        for name, values in size.get("ab", {}).items():
            for j in range(len(values)):
                values[j] = max(r[size_index]["ab"][name][j] for r in per_rank)
        for key in ("runs", "sweep"):
            for j, entry in enumerate(size[key]):
                for field in entry:
                    if field.endswith("_s") or field.endswith("_bytes") or field == "auto_dense":
                        entry[field] = max(r[size_index][key][j][field] for r in per_rank)
    return merged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[2_000, 100_000, 1_000_000])
    parser.add_argument("--every", type=int, nargs="+", default=list(EVERY))
    parser.add_argument("--reps", type=int, default=3, help="measured syncs per cell")
    parser.add_argument(
        "--ab-reps", type=int, default=120, help="alternating syncs for the auto-vs-fixed check"
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-results-md", action="store_true", help="do not edit RESULTS.md")
    parser.add_argument(
        "--replot", action="store_true", help="redraw the PNG from OUT/sparse_sync.json; no run"
    )
    args = parser.parse_args()
    if args.replot:
        _plot(json.loads((args.out / "sparse_sync.json").read_text()), args.out / "sparse_sync.png")
        return
    results, wall = timed(args, _run_workers, args)
    args.out.mkdir(parents=True, exist_ok=True)
    _plot(results, args.out / "sparse_sync.png")
    publish(args, results, _markdown(results, args, wall), "sparse_sync.json", "sparse-sync")


def _run_workers(args: argparse.Namespace) -> list[dict[str, Any]]:
    where = rendezvous()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, where, args, queue)) for r in range(WORLD)]
    for proc in procs:
        proc.start()
    results = queue.get()
    for proc in procs:
        proc.join()
    return results


if __name__ == "__main__":
    main()
