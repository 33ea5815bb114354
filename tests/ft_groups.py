"""Run G torchft replica groups of L forked gloo ranks each (one process group per group),
against an in-process lighthouse, and collect what a function returns on every rank."""

from __future__ import annotations

import datetime
import io
import os
import queue
import traceback
from collections.abc import Callable
from typing import Any

from tests.harness import _CTX, CheckFailed, _free_port


def _group_worker(
    group: int, rank: int, size: int, port: int, fn: Callable, args: tuple, results: Any
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
        WORLD_SIZE=str(size), LOCAL_RANK=str(rank),
    )  # fmt: skip
    os.environ.pop("LOCAL_WORLD_SIZE", None)
    import logging

    import torch
    import torch.distributed as dist

    from sparse2d.known_warnings import ignore_known_warnings

    ignore_known_warnings()
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo", rank=rank, world_size=size, timeout=datetime.timedelta(seconds=60)
        )
        buffer = io.BytesIO()  # bytes, not shared-memory tensors: this process exits at once
        torch.save(fn(group, *args), buffer)
        results.put((group, rank, True, buffer.getvalue()))
    except BaseException as error:
        results.put(
            (group, rank, False, f"{type(error).__name__}: {error}\n{traceback.format_exc()}")
        )
    results.close()
    results.join_thread()  # flush the result before the hard exit below
    os._exit(0)  # skip process-group teardown: the other groups may still be running


def run_groups(
    groups: int, size: int, fn: Callable, *args: Any, timeout: float = 240.0
) -> dict[tuple[int, int], Any]:
    """``fn(group, *args)`` on every rank of ``groups`` groups of ``size``; ``{(g, r): result}``.

    Raises ``CheckFailed`` with every failing rank's traceback, or on a hang."""
    results = _CTX.Queue()
    procs = []
    for g in range(groups):
        port = _free_port()
        for r in range(size):
            p = _CTX.Process(target=_group_worker, args=(g, r, size, port, fn, args, results))
            p.start()
            procs.append(p)
    out: dict[tuple[int, int], tuple[bool, Any]] = {}
    try:
        while len(out) < groups * size:
            g, r, ok, value = results.get(timeout=timeout)
            out[(g, r)] = (ok, value)
    except queue.Empty:
        raise CheckFailed(f"{fn.__name__}: only {sorted(out)} finished within {timeout}s") from None
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    failures = {k: v for k, (ok, v) in out.items() if not ok}
    if failures:
        text = "\n".join(
            f"--- group {g} rank {r} ---\n{v}" for (g, r), v in sorted(failures.items())
        )
        raise CheckFailed(f"{fn.__name__} failed on {sorted(failures)}:\n{text}")
    import torch

    return {k: torch.load(io.BytesIO(v), weights_only=False) for k, (_, v) in out.items()}


def fresh_store() -> object:
    """A new TCPStore for this group (rank 0 serves it), as ``MASTER_PORT`` for the next
    torchft manager in the same processes: a second manager on the same store would read the
    first's keys. Keep the returned store alive while the manager uses it."""
    import torch.distributed as dist
    from torch.distributed import TCPStore

    port = [_free_port() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(port, src=0)
    master = dist.get_rank() == 0
    store = TCPStore("127.0.0.1", port[0], is_master=master, wait_for_workers=False)
    os.environ["MASTER_PORT"] = str(port[0])
    return store
