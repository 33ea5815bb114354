"""Averaging transfers that may run in the background, with delta correction on landing.

Every sync part moves through a ``Pending`` (landed by ``sync.landing.Started``); delayed
optimizer state (``SyncOptions.delayed_optimizer_state``) is a transfer that carries a
snapshot.

A transfer averages a payload's buffers over the replica group. Started
asynchronously at sync point k and completed at sync point k+1, the replicas
keep training meanwhile, so landing the plain average would erase those
updates. ``Pending.complete`` applies ``avg(snapshot) + (live_now - snapshot)``
instead: every update made while the all-reduce was in flight survives, and
with no update in between it reduces to the plain average.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from sparse2d.sync.engines.base import Payload
from sparse2d.sync.transport.collectives import AllReduceHook


class Reduction:
    """An in-flight average of some buffers; ``wait`` returns the averaged values."""

    def __init__(self, works: list[dist.Work], finish: Callable[[], list[torch.Tensor]]) -> None:
        self._works = works
        self._finish = finish

    def wait(self) -> list[torch.Tensor]:
        for work in self._works:
            work.wait()
        return self._finish()


def start_average(
    buffers: list[torch.Tensor],
    pg: dist.ProcessGroup,
    hook: AllReduceHook | None = None,
    async_op: bool = False,
) -> Reduction:
    """Average ``buffers`` (each contiguous) in place over ``pg``.

    Each engine buffer is already one flat tensor, so a plain ``all_reduce`` per
    buffer moves exactly the payload bytes with no coalescing copies. A user hook
    is synchronous by contract, so with a hook nothing is left in flight.
    """
    if hook is not None:
        for buffer in buffers:
            hook([buffer], pg)
        return Reduction([], lambda: buffers)
    works = [
        dist.all_reduce(buffer, op=dist.ReduceOp.AVG, group=pg, async_op=True) for buffer in buffers
    ]
    reduction = Reduction(works, lambda: buffers)
    if not async_op:
        reduction.wait()
        return Reduction([], lambda: buffers)
    return reduction


@dataclass(slots=True)
class Pending:
    """One payload's transfer: started, and landed by ``complete``."""

    payload: Payload
    reduction: Reduction
    snapshot: list[torch.Tensor] | None
    """Values sent, kept when the transfer overlaps training (for the delta correction)."""
    kind: str
    """``"states"`` when the payload holds optimizer state (accumulators scale on landing)."""

    def complete(self) -> float:
        """Wait for the average, land it with delta correction; return seconds spent waiting."""
        begin = time.perf_counter()
        averaged = self.reduction.wait()
        waited = time.perf_counter() - begin
        with torch.no_grad():
            if self.snapshot is not None:
                live = self.payload.gather()
                averaged = [
                    avg + (now - sent)
                    for avg, now, sent in zip(averaged, live, self.snapshot, strict=True)
                ]
            self.payload.scatter(averaged)
        return waited

    def drain(self) -> None:
        """Wait for the average without writing it back (a dropped part)."""
        self.reduction.wait()
