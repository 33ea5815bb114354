"""What an unreleased process group costs, and what a DMPCollection leaves behind.

Two measurements on real gloo ranks (4 processes):
1. Idle cost: CPU time and threads of a process holding ``N`` idle gloo groups for a few
   seconds, then the same after ``destroy_process_group`` (the root cause of the suite's
   load average of 200-400: every idle group's TCP loop thread wakes on a short poll).
2. Constructions: threads and open sockets after each of ``K`` constructions of a
   ``DMPCollection`` (every sharding type, L=2) that is closed, and of one kept open (what
   every model was before ``close()`` existed: nothing released its groups).

    PYTHONPATH=. .venv/bin/python bench/resources_bench.py
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import time
from pathlib import Path
from typing import Any

from bench_util import RESULTS_DIR, publish, spawn, timed

TABLES = (
    ("t0", 40, 8, "table_wise"),
    ("t1", 48, 16, "column_wise"),
    ("t2", 64, 8, "row_wise"),
    ("t3", 32, 16, "table_wise"),
    ("t4", 56, 8, "table_row_wise"),
    ("t5", 4096, 4, "row_wise"),
)
"""(name, rows, dim, sharding type): every sharding type, TWRW's extra groups included."""


def thread_count() -> int:
    """Threads of this process."""
    return len(os.listdir("/proc/self/task"))


def open_sockets() -> int:
    """Open socket descriptors of this process."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:  # the directory's own descriptor is gone by now
            pass
    return count


def build_model() -> Any:
    """A ``DMPCollection`` of ``TABLES`` (SGD fused), L=2, TWRW's node groups of 2."""
    import torch
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    from sparse2d import DMPCollection

    torch.manual_seed(0)
    configs = [
        EmbeddingBagConfig(name=n, embedding_dim=d, num_embeddings=r, feature_names=[f"f_{n}"])
        for n, r, d, _ in TABLES
    ]
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("cpu"))
    _apply_optimizer_in_backward(torch.optim.SGD, ebc.parameters(), {"lr": 0.1})
    constraints = {
        n: ParameterConstraints(sharding_types=[s], min_partition=4) for n, _, _, s in TABLES
    }
    return DMPCollection(ebc, 2, device="cpu", constraints=constraints, node_group_size=2)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def idle_cost(groups: int, seconds: float) -> dict:
    import torch
    import torch.distributed as dist

    made = [dist.new_group(list(range(dist.get_world_size()))) for _ in range(groups)]
    for group in made:
        dist.all_reduce(torch.ones(1), group=group)
    held_threads, start = thread_count(), _cpu_s()
    time.sleep(seconds)
    held = (_cpu_s() - start) / seconds
    for group in made:
        dist.destroy_process_group(group)
    del made
    gc.collect()
    dist.barrier()
    after_threads, start = thread_count(), _cpu_s()
    time.sleep(seconds)
    after = (_cpu_s() - start) / seconds
    return {
        "groups": groups,
        "threads_held": held_threads,
        "cpu_share_held": round(held, 4),
        "threads_destroyed": after_threads,
        "cpu_share_destroyed": round(after, 4),
    }


def constructions(count: int, close: bool) -> list[tuple[int, int]]:
    kept, counts = [], []
    for _ in range(count):
        model = build_model()
        if close:
            model.close()
        else:
            kept.append(model)
        del model
        gc.collect()
        counts.append((thread_count(), open_sockets()))
    for model in kept:
        model.close()
    return counts


def _measure_rank(groups: list[int], seconds: float, count: int) -> dict:
    """Every measurement on one rank of a fresh world (rank 0's is reported)."""
    return {
        "idle": [idle_cost(n, seconds) for n in groups],
        "closed": constructions(count, True),
        "kept_open": constructions(count, False),
    }


def measure(args: argparse.Namespace) -> dict:
    return spawn(4, _measure_rank, args.groups, args.seconds, args.constructions)


def markdown(result: dict, args: argparse.Namespace) -> str:
    idle = "\n".join(
        f"| {r['groups']} | {r['threads_held']} | {100 * r['cpu_share_held']:.1f}% | "
        f"{r['threads_destroyed']} | {100 * r['cpu_share_destroyed']:.1f}% |"
        for r in result["idle"]
    )
    closed, kept = result["closed"], result["kept_open"]
    return f"""## Resources: idle process groups and what a model leaves behind (bench/resources_bench.py)

Rank 0 of 4 gloo processes; {args.machine}.

Idle cost of holding `N` gloo groups for {args.seconds:.0f} s (CPU time / wall time of the
process), then after `destroy_process_group` of all of them:

| groups held | threads | CPU while idle | threads after destroy | CPU after destroy |
|---|---|---|---|---|
{idle}

Each idle group keeps a TCP loop thread that wakes on a short poll timeout and two work
threads: the "spinning" of the suite's leaked groups was this polling, hundreds of groups per
worker at once (load average 200-400); a survivor of a lost rank holds the same idle loops
(measured alike). Releasing the groups is the fix.

{args.constructions} constructions of a `DMPCollection` (TW/CW/RW/TWRW tables, L=2, world 4),
threads and open sockets of rank 0 after each:

| | after the first | after the last | growth per construction |
|---|---|---|---|
| `close()` after each | {closed[0]} | {closed[-1]} | {(closed[-1][0] - closed[0][0]) / (len(closed) - 1):.1f} threads |
| kept open (as before `close()` existed) | {kept[0]} | {kept[-1]} | {(kept[-1][0] - kept[0][0]) / (len(kept) - 1):.1f} threads |

Regenerate: `PYTHONPATH=. .venv/bin/python bench/resources_bench.py`.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, nargs="+", default=[0, 50, 200])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--constructions", type=int, default=8)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-results-md", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result, _ = timed(args, measure, args)
    publish(args, result, markdown(result, args), "resources.json", "resources")


if __name__ == "__main__":
    main()
