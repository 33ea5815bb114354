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
Writes ``bench/sparse_sync.json``, ``bench/sparse_sync.png`` and the section of
``bench/RESULTS.md`` between the ``sparse-sync`` markers.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from bench_util import free_port, publish, rendezvous_env, timed

from sparse2d.sync.sparse import DEFAULT_CROSSOVER

HERE = Path(__file__).resolve().parent
WORLD, L, DIM, BATCH, TABLES = 4, 2, 64, 512, 2
EVERY = (1, 4, 16, 64)
DISTS = ("uniform", "zipf")
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

    from sparse2d.collection import DMPCollection
    from sparse2d.sync.auto import AutoEngine
    from sparse2d.sync.engine import DenseEngine
    from sparse2d.sync.sparse import SparseEngine

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
                    dict(dist=dist_name, every=every, sparse_s=s_sec, dense_s=d_sec,
                         sparse_bytes=s_bytes, meta_bytes=s_meta, dense_bytes=d_bytes,
                         union_fraction=fraction, step_s=step_s, auto_s=a_sec,
                         auto_dense=float(auto.mode == "dense"))
                )  # fmt: skip
    twin = SparseEngine(shards, pg)  # A/A controls: the measurement's own noise and bias
    engines = {"sparse": sparse, "dense": dense, "auto": auto, "twin": twin,
               "dense_twin": DenseEngine(shards, pg)}  # fmt: skip
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
            dict(fraction=fraction, sparse_s=s_sec, dense_s=d_sec, sparse_bytes=s_bytes + s_meta,
                 dense_bytes=d_bytes)
        )  # fmt: skip
    sparse.close()
    auto.close()
    return out


def _worker(rank: int, port: int, args: argparse.Namespace, queue: Any) -> None:
    rendezvous_env(rank, WORLD, port)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=600)
    )
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


def _paired(numerator: list[float], denominator: list[float]) -> float:
    """Median of per-step ratios (nan without data)."""
    ratios = sorted(a / b for a, b in zip(numerator, denominator, strict=False) if b > 0)
    return ratios[len(ratios) // 2] if ratios else float("nan")


def _crossover(sweep: list[dict[str, Any]]) -> float:
    """Touched fraction where the sparse sync gets as slow as the dense one (interpolated)."""
    prev = None
    for point in sweep:
        ratio = point["sparse_s"] / point["dense_s"]
        if ratio >= 1.0:
            if prev is None:
                return point["fraction"]
            f0, r0 = prev
            return f0 + (1.0 - r0) * (point["fraction"] - f0) / (ratio - r0)
        prev = (point["fraction"], ratio)
    return 1.0


def _summaries(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows_out = []
    for size in results:
        groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for run in size["runs"]:
            groups.setdefault((run["dist"], run["every"]), []).append(run)
        for (dist_name, every), runs in groups.items():
            med = {k: sorted(r[k] for r in runs)[len(runs) // 2] for k in runs[0] if k != "dist"}
            sparse_bytes = med["sparse_bytes"] + med["meta_bytes"]
            rows_out.append(
                dict(rows=size["rows"], dist=dist_name, every=every, union=med["union_fraction"],
                     step_ms=med["step_s"] * 1e3,
                     sparse_mb=sparse_bytes / 1e6, dense_mb=med["dense_bytes"] / 1e6,
                     bytes_x=med["dense_bytes"] / max(sparse_bytes, 1),
                     sparse_ms=med["sparse_s"] * 1e3, dense_ms=med["dense_s"] * 1e3,
                     time_x=med["dense_s"] / med["sparse_s"], auto_ms=med["auto_s"] * 1e3,
                     auto_dense=sum(r["auto_dense"] for r in runs) / len(runs),
                     auto_x=med["auto_s"] / min(med["sparse_s"], med["dense_s"]))
            )  # fmt: skip
    return rows_out


def _markdown(results: list[dict[str, Any]], args: argparse.Namespace, wall: float) -> str:
    lines = [
        "## Sparse replica sync (touched rows only) vs dense sync",
        "",
        f"`bench/sparse_sync_bench.py` — 4 gloo CPU processes ({args.machine}; ratios are "
        f"measured within one run), L=2 (2 replicas per shard), {TABLES} TW tables x {DIM} fp32, row-wise "
        f"Adagrad (weights + row state synced), batch {BATCH}/rank, 1 id/sample/table, median of "
        f"{args.reps} syncs per cell, slowest rank; sparse bytes include the union metadata "
        f"(counts, id lists or bitmaps). *Synced rows* = fraction of rows in the sparse payload "
        f"(1.0 = the engine fell back to dense at its crossover). *step ms* = one training step. "
        f"Wall time {wall:.0f} s.",
        "",
        "| rows/table | ids | sync_every | synced rows | sparse MB | dense MB | bytes x | step ms "
        "| sparse ms | dense ms | time x | auto ms | auto dense | auto / best |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in _summaries(results):
        lines.append(
            f"| {r['rows']:.0e} | {r['dist']} | {r['every']} | {r['union']:.4f} | "
            f"{r['sparse_mb']:.2f} | {r['dense_mb']:.1f} | {r['bytes_x']:.1f} | {r['step_ms']:.1f} | "
            f"{r['sparse_ms']:.1f} | {r['dense_ms']:.1f} | {r['time_x']:.1f} | "
            f"{r['auto_ms']:.1f} | {r['auto_dense']:.2f} | {r['auto_x']:.2f} |"
        )
    lines += ["", "Crossover sweep (never-dense sparse sync vs dense, union = fraction):", ""]
    lines += ["| rows/table | fraction | sparse ms | dense ms | sparse/dense |", "|---:|---:|---:|---:|---:|"]  # fmt: skip
    for size in results:
        for p in size["sweep"]:
            lines.append(
                f"| {size['rows']:.0e} | {p['fraction']} | {p['sparse_s'] * 1e3:.1f} | "
                f"{p['dense_s'] * 1e3:.1f} | {p['sparse_s'] / p['dense_s']:.2f} |"
            )
    lines += ["", f"Auto vs the fixed engines, alternating: Zipf ids, sync every step, "
              f"{args.ab_reps} steps; each step times every engine, in all orders in turn, "
              f"plus a second touched-rows and a second dense engine (A/A controls: their "
              f"ratios to the first are the measurement's own noise and bias, the floor under "
              f"any auto / best figure). Slowest rank per sync; auto keeps what "
              f"it learnt in the cells above, as in a long run. *Paired* = median over steps of "
              f"the per-step ratio (load hits both alike). This is the acceptance check of "
              f"`auto` (goal <= 1.05):", "",
              "| rows/table | sparse ms | dense ms | auto ms | auto / best (medians) "
              "| auto / best (paired) | A/A sparse (medians, paired) "
              "| A/A dense (medians, paired) | auto dense syncs |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    nan = float("nan")
    for size in results:
        ab = size.get("ab")
        if ab and ab["auto"]:
            med = {k: sorted(v)[len(v) // 2] for k, v in ab.items()}
            best = "sparse" if med["sparse"] <= med["dense"] else "dense"
            lines.append(
                f"| {size['rows']:.0e} | {med['sparse'] * 1e3:.1f} | {med['dense'] * 1e3:.1f} | "
                f"{med['auto'] * 1e3:.1f} | {med['auto'] / med[best]:.2f} | "
                f"{_paired(ab['auto'], ab[best]):.2f} | "
                f"{med.get('twin', nan) / med['sparse']:.2f}, "
                f"{_paired(ab.get('twin', []), ab['sparse']):.2f} | "
                f"{med.get('dense_twin', nan) / med['dense']:.2f}, "
                f"{_paired(ab.get('dense_twin', []), ab['dense']):.2f} | "
                f"{sum(ab['auto_dense']):.0f} / {len(ab['auto_dense'])} |"
            )
    crossovers = ", ".join(f"{s['rows']:.0e} rows: {_crossover(s['sweep']):.2f}" for s in results)
    lines += [
        "",
        f"Measured crossover (sparse time = dense time): {crossovers}. The engine's default "
        f"`DEFAULT_CROSSOVER` = {DEFAULT_CROSSOVER} (a shard whose replica union exceeds it is "
        f"synced densely) was used for the *sparse* columns of the first table. *auto* = "
        f'`engine="auto"` (`sparse2d/sync/auto.py`): per sync the cheaper of dense and '
        f"touched rows by the cost model probed at start-up, corrected per mode by its timed "
        f"syncs; *auto dense* = fraction of its measured syncs that ran dense; *auto / best* = "
        f"its median time over the better of the sparse and dense medians. With {args.reps} "
        f"syncs per cell, a cell shows auto while it learns a changed workload (the cells "
        f"change sync interval and id distribution); the alternating table below is steady.",
    ]
    return "\n".join(lines)


def _plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bytes_ax, left, right) = plt.subplots(1, 3, figsize=(17, 4.5))
    summaries = _summaries(results)
    for rows in sorted({r["rows"] for r in summaries}):
        for dist_name, marker in zip(DISTS, ("o", "s"), strict=True):
            cells = [r for r in summaries if r["rows"] == rows and r["dist"] == dist_name]
            everys = [r["every"] for r in cells]
            label = f"{rows:.0e} rows, {dist_name}"
            left.plot(
                everys, [r["sparse_ms"] for r in cells], marker=marker, label=f"sparse {label}"
            )
            bytes_ax.plot(
                everys, [r["sparse_mb"] for r in cells], marker=marker, label=f"sparse {label}"
            )
        dense_mb = [r["dense_mb"] for r in summaries if r["rows"] == rows]
        bytes_ax.axhline(dense_mb[0], linestyle="--", color="gray")
        bytes_ax.text(1, dense_mb[0] * 1.15, f"dense {rows:.0e}", color="gray")
        dense = [r["dense_ms"] for r in summaries if r["rows"] == rows]
        left.axhline(sorted(dense)[len(dense) // 2], linestyle="--", color="gray")
        left.text(1, sorted(dense)[len(dense) // 2] * 1.1, f"dense {rows:.0e}", color="gray")
    left.set(xscale="log", yscale="log", xlabel="sync_every (steps)", ylabel="sync time (ms)",
             title="Sync time per sync (2 replicas, 4 gloo ranks)")  # fmt: skip
    left.legend(fontsize=7)
    bytes_ax.set(xscale="log", yscale="log", xlabel="sync_every (steps)",
                 ylabel="MB sent per rank per sync", title="Bytes per sync (dashed: dense)")  # fmt: skip
    bytes_ax.legend(fontsize=7)
    for size in results:
        fractions = [p["fraction"] for p in size["sweep"]]
        ratio = [p["sparse_s"] / p["dense_s"] for p in size["sweep"]]
        right.plot(fractions, ratio, marker="o", label=f"{size['rows']:.0e} rows")
    right.axhline(1.0, linestyle="--", color="gray")
    right.set(xscale="log", xlabel="touched fraction (union)", ylabel="sparse time / dense time",
              title="Crossover: sparse sync vs dense sync")  # fmt: skip
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[2_000, 100_000, 1_000_000])
    parser.add_argument("--every", type=int, nargs="+", default=list(EVERY))
    parser.add_argument("--reps", type=int, default=3, help="measured syncs per cell")
    parser.add_argument(
        "--ab-reps", type=int, default=120, help="alternating syncs for the auto-vs-fixed check"
    )
    parser.add_argument("--out", type=Path, default=HERE)
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
    port = free_port()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, port, args, queue)) for r in range(WORLD)]
    for proc in procs:
        proc.start()
    results = queue.get()
    for proc in procs:
        proc.join()
    return results


if __name__ == "__main__":
    main()
