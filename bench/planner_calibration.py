"""Calibrate the group-size advisor on this machine: measured vs predicted, every (world, L).

Worlds of 4 and 8 gloo CPU processes; for every divisor L a ``DMPCollection`` of table-wise
tables (row-wise AdaGrad) trains ``--steps`` steps with a dense sync after each. Per step:
forward+backward (lookup, all-to-all, fused update) and ``sync()`` are timed separately;
medians, max over ranks. The all-to-all share is fwd+bwd at L minus fwd+bwd at L=1 of the
same world (L=1 has no exchange and the same lookup work per rank for balanced tables).

The ``cpu_gloo`` topology is then fitted by least squares: link bandwidth and per-message
latency from the sync and all-to-all times, lookup bandwidth and a fixed per-step overhead
from the rest. Predicted vs measured step times and the Spearman rank correlation of the
order of L go to ``bench/RESULTS.md``. Same points for fit and check (7 pairs, 4 constants).
Usage: ``.venv/bin/python bench/planner_calibration.py [--steps 6] [--no-write]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np
import torch.multiprocessing as mp
from bench_util import free_port, rendezvous_env, write_section

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TABLES, DIM = 8, 32
NOISE_S = 0.005
"""Timing noise floor on the shared 2-core machine (seconds)."""
SAVED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "planner_calibration.json")
WORKLOADS = ((20_000, 256), (2_000, 2048))
"""(rows per table, samples per rank): sync-heavy, and all-to-all-heavy."""


def _model(rows: int) -> Any:
    import torch
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec import EmbeddingBagCollection
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.optim import RowWiseAdagrad

    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name=f"t{i}", embedding_dim=DIM, num_embeddings=rows,
                                   feature_names=[f"f{i}"]) for i in range(TABLES)],
        device=torch.device("meta"),
    )  # fmt: skip
    _apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), {"lr": 0.01})
    return ebc


def _batch(step: int, rank: int, rows: int, batch: int) -> Any:
    import torch
    from torchrec import KeyedJaggedTensor

    gen = torch.Generator().manual_seed(step * 101 + rank)
    lengths = torch.randint(1, 4, (TABLES * batch,), generator=gen)  # mean 2 ids per bag
    values = torch.randint(0, rows, (int(lengths.sum()),), generator=gen)
    keys = [f"f{i}" for i in range(TABLES)]
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths)


def _worker(rank: int, world: int, port: int, steps: int, out: Any) -> None:
    rendezvous_env(rank, world, port)
    import torch
    import torch.distributed as dist
    from torchrec.distributed.planner.types import ParameterConstraints

    from sparse2d import DMPCollection
    from sparse2d.mesh import divisors
    from sparse2d.sync.policy import SyncOptions

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=900))
    constraints = {
        f"t{i}": ParameterConstraints(sharding_types=["table_wise"]) for i in range(TABLES)
    }
    result = {}
    for (rows, bsz), L in ((w, L) for w in WORKLOADS for L in divisors(world)):
        model = DMPCollection(_model(rows), L, device="cpu", constraints=constraints,
                              planner_batch_size=bsz, sync_options=SyncOptions(engine="dense"))  # fmt: skip
        fwdbwd, sync = [], []
        for step in range(steps + 2):
            batch = _batch(step, rank, rows, bsz)
            dist.barrier()
            begin = time.perf_counter()
            model(batch).values().square().mean().backward()
            middle = time.perf_counter()
            model.sync()
            end = time.perf_counter()
            if step >= 2:  # warm-up
                fwdbwd.append(middle - begin)
                sync.append(end - middle)
        result[(rows, bsz, L)] = (statistics.median(fwdbwd), statistics.median(sync))
        del model
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, result)
    if rank == 0:
        out.put(gathered)
    dist.destroy_process_group()


def measure(world: int, steps: int) -> dict[tuple[int, ...], dict[str, float]]:
    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, steps, out)) for r in range(world)]
    for p in procs:
        p.start()
    ranks = out.get(timeout=1800)
    for p in procs:
        p.join(timeout=60)
    measured = {}
    for rows, bsz, L in ranks[0]:
        base = max(r[(rows, bsz, 1)][0] for r in ranks)
        fwdbwd = max(r[(rows, bsz, L)][0] for r in ranks)
        sync = max(r[(rows, bsz, L)][1] for r in ranks)
        measured[(rows, bsz, world, L)] = {
            "a2a": max(0.0, fwdbwd - base),
            "sync": sync,
            "step": fwdbwd + sync,
        }
    return measured


def _spearman(a: list[float], b: list[float]) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1]) if len(a) > 1 else 1.0


def fit_and_report(measured: dict[tuple[int, ...], dict[str, float]]) -> str:
    """Fit ``cpu_gloo`` on every (rows, batch, world, L) point; table + rank correlations."""
    from sparse2d.planner.cost_model import AnalyticCostModel
    from sparse2d.planner.group_layout import TorchRecGroupPlanner
    from sparse2d.planner.topology import PRESETS
    from sparse2d.planner.workload import TableLoad, Workload

    planner = TorchRecGroupPlanner()

    def estimate(key: tuple[int, ...], topology: Any) -> Any:
        rows, bsz, world, L = key
        workload = Workload(
            tables=tuple(
                TableLoad(f"t{i}", rows, DIM, 1, 2.0, "table_wise") for i in range(TABLES)
            ),
            batch_size_per_rank=bsz,
        )
        return AnalyticCostModel(workload, topology.with_world_size(world), planner).estimate(L)

    base = dataclasses.replace(PRESETS["cpu_gloo"], step_overhead_s=0.0, sync_overhead_s=0.0)
    est = {key: estimate(key, base) for key in measured}
    # links: t = x_bytes / bw + x_msgs * alpha, over sync (G > 1) and all-to-all (L > 1)
    rows, ys = [], []
    for key, c in est.items():
        world, L = key[2], key[3]
        G = world // L
        if G > 1:
            rows.append([2 * (G - 1) / G * c.sync_bytes, 2 * (G - 1), 1])  # cpu_gloo: ring
            ys.append(measured[key]["sync"])
        if L > 1 and measured[key]["a2a"] > NOISE_S:  # a difference of two noisy times
            rows.append([c.a2a_bytes, 3 * (L - 1), 0])
            ys.append(measured[key]["a2a"])
    weight = 1 / np.maximum(np.array(ys), NOISE_S)  # relative errors above the noise floor
    (inv_bw, alpha, sync_fixed), *_ = np.linalg.lstsq(
        np.array(rows) * weight[:, None], np.array(ys) * weight, rcond=None
    )
    # lookups: the remainder = 3 * lookup bytes / lookup_bw + overhead
    x = [c.compute_s * base.lookup_bw for c in est.values()]  # bytes streamed (no dense part)
    y = [measured[k]["step"] - measured[k]["sync"] - measured[k]["a2a"] for k in est]
    slope, overhead = np.polyfit(x, y, 1)
    if slope <= 0 or overhead < 0:  # keep the constants physical
        slope, overhead = float(np.mean(y)) / float(np.mean(x)), 0.0
    fitted = dataclasses.replace(
        PRESETS["cpu_gloo"],
        intra_host_bw=float(1 / max(inv_bw, 1e-12)), inter_host_bw=float(1 / max(inv_bw, 1e-12)),
        intra_host_latency_s=float(max(alpha, 0.0)), inter_host_latency_s=float(max(alpha, 0.0)),
        lookup_bw=float(1 / max(slope, 1e-15)), step_overhead_s=float(max(overhead, 0.0)),
        sync_overhead_s=float(max(sync_fixed, 0.0)),
    )  # fmt: skip
    lines = [
        "| rows x batch | world | L | G | a2a meas / pred ms | sync meas / pred ms "
        "| step meas / pred ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    series: dict[tuple[int, int, int], list[tuple[int, float, float]]] = {}
    for key in sorted(measured):
        rows_, bsz, world, L = key
        c, m = estimate(key, fitted), measured[key]
        lines.append(
            f"| {rows_} x {bsz} | {world} | {L} | {world // L} | {m['a2a'] * 1e3:.1f} / "
            f"{c.a2a_s * 1e3:.1f} | {m['sync'] * 1e3:.1f} / {c.sync_s * 1e3:.1f} | "
            f"{m['step'] * 1e3:.1f} / {c.step_s * 1e3:.1f} |"
        )
        series.setdefault((rows_, bsz, world), []).append((L, c.step_s, m["step"]))
    lines.append("")
    all_rho = []
    for (rows_, bsz, world), points in series.items():
        rho = _spearman([p[1] for p in points], [p[2] for p in points])
        all_rho.append(rho)
        best_m = min(points, key=lambda p: p[2])[0]
        best_p = min(points, key=lambda p: p[1])[0]
        lines.append(
            f"- {rows_} rows x {bsz} samples, world {world}: Spearman rank correlation of step "
            f"time over L = {rho:.2f}; fastest L measured {best_m}, predicted {best_p}."
        )
    lines.append(
        f"- {len(measured)} (workload, world, L) points; mean Spearman {np.mean(all_rho):.2f}. "
        f"Fitted `cpu_gloo`: link bandwidth {fitted.intra_host_bw / 1e9:.3f} GB/s, latency "
        f"{fitted.intra_host_latency_s * 1e6:.0f} us/message, lookup bandwidth "
        f"{fitted.lookup_bw / 1e9:.3f} GB/s, step overhead {fitted.step_overhead_s * 1e3:.1f} ms, "
        f"sync overhead {fitted.sync_overhead_s * 1e3:.1f} ms."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--worlds", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--refit", action="store_true", help=f"refit {SAVED}, measure nothing")
    args = parser.parse_args(argv)
    if args.refit:
        with open(SAVED) as f:
            measured = {tuple(map(int, k.split(","))): v for k, v in json.load(f).items()}
    else:
        measured = {k: v for w in args.worlds for k, v in measure(w, args.steps).items()}
        with open(SAVED, "w") as f:
            json.dump({",".join(map(str, k)): v for k, v in measured.items()}, f, indent=1)
    text = fit_and_report(measured)
    print(text)
    if not args.no_write:
        header = (
            "## Group-size advisor calibration (bench/planner_calibration.py)\n\n"
            "Command: `.venv/bin/python bench/planner_calibration.py --steps 6` (measures, saves "
            "`bench/planner_calibration.json`, fits); `--refit` refits the saved times. "
            f"{TABLES} table-wise tables of DIM={DIM} fp32 (row-wise AdaGrad) in two workloads "
            "(rows x samples per rank below), 2 ids per bag, dense sync after every step; gloo "
            "CPU processes "
            "on the 2-core machine, shared with other engineers' test runs at the time (8 "
            "processes on 2 cores are heavily oversubscribed: absolute ms are noisy, the order "
            "of L is the output). Median of the timed steps, max over ranks. a2a measured = "
            "forward+backward at L minus at L=1. The fit uses the same points it is checked on."
            "\n\n"
        )
        write_section(header + text, "planner-calibration")
    return 0


if __name__ == "__main__":
    sys.exit(main())
