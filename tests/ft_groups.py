"""Run G torchft replica groups of L forked gloo ranks each (one process group per group),
against an in-process lighthouse, and collect what a function returns on every rank."""

from __future__ import annotations

import datetime
import io
import os
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

from tests.harness import _CTX, CheckFailed, own_store


def _group_worker(
    group: int, rank: int, size: int, ports: Any, fn: Callable, args: tuple, results: Any
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        RANK=str(rank),
        WORLD_SIZE=str(size),
        LOCAL_RANK=str(rank),
    )
    os.environ.pop("LOCAL_WORLD_SIZE", None)
    import logging

    import torch
    import torch.distributed as dist

    from sparse2d.known_warnings import ignore_known_warnings

    ignore_known_warnings()
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    try:
        timeout = datetime.timedelta(seconds=60)
        store = own_store(rank, size, ports, timeout)  # MASTER_PORT: torchft's manager reads it
        dist.init_process_group("gloo", store=store, rank=rank, world_size=size, timeout=timeout)
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
    procs, port_queues = [], []
    for g in range(groups):
        ports = _CTX.Queue()  # kept below: a child unpickles it after its start returns
        port_queues.append(ports)
        for r in range(size):
            p = _CTX.Process(target=_group_worker, args=(g, r, size, ports, fn, args, results))
            p.start()
            procs.append(p)
    out: dict[tuple[int, int], tuple[bool, Any]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(out) < groups * size:
            try:  # short waits: a rank that died before reporting fails the check at once
                g, r, ok, value = results.get(timeout=1.0)
                out[(g, r)] = (ok, value)
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead or time.monotonic() > deadline:
                    raise CheckFailed(
                        f"{fn.__name__}: only {sorted(out)} finished (exit codes of the dead: "
                        f"{dead}) within {timeout}s"
                    ) from None
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

    master = dist.get_rank() == 0  # binds a port the kernel picks: nobody can take it first
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False) if master else None
    port = [server.port if server is not None else None]
    dist.broadcast_object_list(port, src=0)
    store = server or TCPStore("127.0.0.1", port[0], is_master=False, wait_for_workers=False)
    os.environ["MASTER_PORT"] = str(port[0])
    return store
