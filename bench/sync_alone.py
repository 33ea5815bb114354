"""The replica sync timed on its own: a barrier between the backward and ``sync()``.

``planner_holdout.py`` times the sync as the first collective after the backward, so a
fast rank's sync also holds its wait for the slowest rank. Here the wait is timed apart
(the barrier) and the sync alone after it, per rank, for one series at every ``L`` (steps
alternated as in the holdout harness). Used to find what the advisor's sync term misses.

Usage: ``PYTHONPATH=. .venv/bin/python bench/sync_alone.py [SERIES] [ROUNDS]`` (default
``rw_a2a_w4``, 8 rounds x 2 steps per L after a warm-up round).
"""

from __future__ import annotations

import datetime
import statistics
import sys
import time
from typing import Any

import torch.multiprocessing as mp
from bench_util import free_port, rendezvous_env
from planner_holdout import FIT_SERIES, SERIES, Series


def _worker(rank: int, world: int, port: int, series: Series, rounds: int, out: Any) -> None:
    rendezvous_env(rank, world, port)
    import torch
    import torch.distributed as dist
    from planner_holdout import _batch, _build

    from sparse2d.mesh import divisors

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=900))
    models = {L: _build(series, L) for L in divisors(world)}
    times: dict[int, tuple[list[float], ...]] = {L: ([], [], []) for L in models}
    step = 0
    for r in range(rounds + 1):  # round 0 warms up every L
        for L, model in models.items():
            for _ in range(2):
                batch = _batch(series, step, rank)
                step += 1
                dist.barrier()
                begin = time.perf_counter()
                model(batch).values().square().mean().backward()
                backward = time.perf_counter()
                dist.barrier()
                waited = time.perf_counter()
                model.sync()
                end = time.perf_counter()
                if r:
                    for part, t in zip(times[L], (backward - begin, waited - backward,
                                                  end - waited)):  # fmt: skip
                        part.append(t)
    mine = {L: tuple(statistics.median(p) for p in parts) for L, parts in times.items()}
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        out.put(gathered)
    for model in models.values():
        model.close()
    dist.destroy_process_group()


def measure(series: Series, rounds: int) -> dict[int, list[tuple[float, float, float]]]:
    """``{L: [(forward+backward, wait, sync alone) seconds, per rank]}`` (medians)."""
    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_worker, args=(r, series.world, port, series, rounds, out))
             for r in range(series.world)]  # fmt: skip
    for p in procs:
        p.start()
    try:
        ranks = out.get(timeout=900)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return {L: [r[L] for r in ranks] for L in ranks[0]}


def main(argv: list[str]) -> int:
    name = argv[0] if argv else "rw_a2a_w4"
    rounds = int(argv[1]) if len(argv) > 1 else 8
    series = next(s for s in SERIES + FIT_SERIES if s.name == name)
    print(f"{name}: per rank, median ms (forward+backward, wait at the barrier, sync alone)")
    for L, ranks in measure(series, rounds).items():
        parts = ", ".join("(" + ", ".join(f"{v * 1e3:.1f}" for v in r) + ")" for r in ranks)
        print(f"  L={L}: {parts}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
