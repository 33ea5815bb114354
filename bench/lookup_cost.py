"""FBGEMM CPU lookup cost per id and per distinct row: what sets ``row_update_s``.

Why: the advisor priced a lookup by its bytes only, the same at every ``L``; the held-out
series ``tw_a2a_fp32_w8`` (issue 25) measured L=1 forward+backward far above that. At L=1
a rank looks up the same ids as at L=8 but spread over 8x the tables, so it touches many
more distinct rows. This measures FBGEMM's CPU TBE alone (row-wise AdaGrad fused in the
backward, one thread, 16 tables) over a grid of dim x rows x batch, and fits
``time = ids x per_id + distinct rows x per_row`` (relative least squares): the backward
groups ids by row and the fused optimizer updates each distinct row once.

Second table: the same step in 1, 4 and 8 processes at once on this 2-core box (each one
thread): how much slower a rank's CPU work runs when ranks outnumber cores, which the
advisor prices as ``ranks / cores_per_host`` (``cost_terms.on_shared_cores``).

Run: ``PYTHONPATH=. .venv/bin/python bench/lookup_cost.py`` (~3 minutes).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch
from bench_util import write_section
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
)

TABLES = 16


def median_ms(tables: int, batch: int, rows: int, dim: int, reps: int) -> tuple[float, int, int]:
    """Median forward+backward ms of one TBE over ``tables`` x ``batch`` bags of 1-3 uniform
    ids, the ids per step and the distinct (table, row) pairs they touch."""
    spec = [(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU)] * tables
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        spec, optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.1
    )
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 4, (tables * batch,), generator=gen)
    ids = torch.randint(0, rows, (int(lengths.sum()),), generator=gen)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    table_of = torch.repeat_interleave(torch.arange(tables), lengths.view(tables, -1).sum(1))
    distinct = int(torch.unique(table_of * rows + ids).numel())
    times = []
    for rep in range(reps + 3):  # 3 warm-up steps
        begin = time.perf_counter()
        tbe(ids, offsets).sum().backward()
        if rep >= 3:
            times.append(time.perf_counter() - begin)
    return statistics.median(times) * 1e3, ids.numel(), distinct


def fit_per_id_and_row(points: list[tuple[int, int, float]]) -> tuple[float, float, float]:
    """(s per id, s per distinct row, max relative error) of ``ms = ids a + rows b``."""
    a = np.array([[ids, rows] for ids, rows, _ in points], dtype=np.float64)
    y = np.array([ms * 1e-3 for _, _, ms in points])
    (per_id, per_row), *_ = np.linalg.lstsq(a / y[:, None], np.ones(len(y)), rcond=None)
    error = float(np.max(np.abs(a @ np.array([per_id, per_row]) / y - 1)))
    return float(per_id), float(per_row), error


def _concurrent_worker(rows: int, reps: int, barrier: object, out: object) -> None:
    torch.set_num_threads(1)
    barrier.wait()  # type: ignore[attr-defined]
    ms, ids, _ = median_ms(TABLES, 2048, rows, 32, reps)
    out.put(ms / ids)  # type: ignore[attr-defined]


def concurrent_us_per_id(procs: int, rows: int, reps: int) -> float:
    """Median over ``procs`` processes, started together, of their us per id."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(procs), ctx.Queue()
    workers = [
        ctx.Process(target=_concurrent_worker, args=(rows, reps, barrier, out))
        for _ in range(procs)
    ]
    for w in workers:
        w.start()
    results = [out.get(timeout=600) for _ in workers]
    for w in workers:
        w.join()
    return statistics.median(results) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    lines = [
        "## Lookup cost per id and per distinct row (bench/lookup_cost.py)",
        "",
        f"One process, one thread, FBGEMM CPU TBE ({TABLES} fp32 tables, row-wise AdaGrad "
        f"fused in the backward, uniform ids, 1-3 per bag), forward+backward median of "
        f"{args.reps} steps. Fit per dim: `ms = ids x per_id + distinct rows x per_row`.",
        "",
        "| dim | rows | batch | ids | distinct rows | ms | us per id |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    fits = []
    for dim in (8, 32, 128):
        points = []
        for rows in (250, 1000, 4000, 16000, 64000):
            for batch in (512, 2048):
                ms, ids, distinct = median_ms(TABLES, batch, rows, dim, args.reps)
                points.append((ids, distinct, ms))
                lines.append(
                    f"| {dim} | {rows} | {batch} | {ids} | {distinct} | {ms:.2f} | "
                    f"{ms / ids * 1e3:.3f} |"
                )
                print(lines[-1], flush=True)
        fits.append((dim, *fit_per_id_and_row(points)))
    lines += [
        "",
        "| dim | per id (us) | per distinct row (us) | max rel. error |",
        "|---:|---:|---:|---:|",
    ]
    lines += [f"| {d} | {i * 1e6:.3f} | {r * 1e6:.3f} | {e:.2f} |" for d, i, r, e in fits]
    per_row = statistics.median(r for _, _, r, _ in fits)
    cores = os.cpu_count() or 1
    lines += [
        "",
        f"Concurrent processes on this {cores}-core box (dim 32, batch 2048, us per id):",
        "",
        "| rows | 1 process | 4 processes | 8 processes | 4 / 1 | 8 / 1 | ranks per core at 4, 8 |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    for rows in (1000, 64000):
        one, four, eight = (concurrent_us_per_id(n, rows, args.reps) for n in (1, 4, 8))
        lines.append(
            f"| {rows} | {one:.3f} | {four:.3f} | {eight:.3f} | {four / one:.2f} | "
            f"{eight / one:.2f} | {max(1, 4 / cores):g}, {max(1, 8 / cores):g} |"
        )
        print(lines[-1], flush=True)
    lines += [
        "",
        f"Reading it: a distinct row costs {per_row * 1e6:.2f} us whatever its width (median "
        "over the dims), an id a few hundredths of a us growing with the dim. So at the same "
        "ids a rank whose ids spread over more rows (small L: every table on every rank) pays "
        "more, which the bytes-only lookup term missed. `cpu_gloo.row_update_s` is this "
        "per-row cost (one core); the advisor multiplies CPU work by ranks per core "
        "(`cores_per_host`) and fits the per-byte and fixed costs end to end "
        "(`bench/planner_calibration.py`).",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section(text, "lookup-cost")


if __name__ == "__main__":
    main()
