"""Sync engines decide *which values* are averaged; the policy decides *when and how*.

An engine turns the live shards into a ``Payload``: contiguous buffers that are
safe to all-reduce (also asynchronously, also in reduced precision), plus
``scatter`` to write averaged values back and ``gather`` to re-read the live
values at the same positions (for overlapped sync's delta correction).
``DenseEngine`` covers every row; the sparse engine covers touched rows only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from sparse2d.sync.tensors import ShardState, by_dtype, flush_caches, live_tensors


@dataclass(slots=True)
class Payload:
    """Values to average over the replica group and where they live."""

    buffers: list[torch.Tensor]
    """Contiguous copies, at most one per dtype and kind; averaged in place by the policy."""
    scatter: Callable[[list[torch.Tensor]], None]
    """Write tensors shaped like ``buffers`` back into the live shards."""
    gather: Callable[[], list[torch.Tensor]]
    """Fresh copies of the live values at the positions of ``buffers``."""

    @property
    def bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers)


class BufferPool:
    """Payload buffers kept from one sync to the next.

    A fresh multi-MB buffer per sync pays the kernel's zero-fill of every page on first
    touch (glibc maps large blocks anew each time): on the CPU box, building a 67 MB
    payload took 39 ms into a fresh buffer and 12 ms into a reused one. Safe because the
    policy lands every transfer before it builds the next payload. The cost: each buffer
    stays allocated between syncs (the peak is unchanged: it existed during every sync).
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[object, torch.dtype], torch.Tensor] = {}

    def take(
        self, key: object, numel: int, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """A flat ``numel`` buffer for ``key`` (grown when too small; contents undefined)."""
        buffer = self._buffers.get((key, dtype))
        if buffer is None or buffer.numel() < numel or buffer.device != device:
            buffer = torch.empty(numel, dtype=dtype, device=device)
            self._buffers[(key, dtype)] = buffer
        return buffer[:numel]


class SyncEngine(ABC):
    """Chooses the values of a replica sync."""

    def __init__(self, shards: list[ShardState], replica_pg: dist.ProcessGroup) -> None:
        self.shards = shards
        self.replica_pg = replica_pg
        self.pool = BufferPool()
        """Payload buffers reused across syncs (``Payload.buffers``; never ``gather``'s)."""

    @abstractmethod
    def payload(self, weights: bool, states: bool) -> Payload:
        """Collect the values to average. May run metadata collectives on ``replica_pg``."""

    def synced(self, weights: bool, states: bool) -> None:  # noqa: B027 (optional hook)
        """Called after a sync of (weights, states) completed; engines reset tracking here."""

    def observe(self, seconds: float) -> None:  # noqa: B027 (optional hook)
        """The sync's exposed time (build, waits, write-back), once it landed; cost models
        learn from it (``AutoEngine``)."""


class DenseEngine(SyncEngine):
    """Every row of every shard: one flat buffer per dtype and kind."""

    def payload(self, weights: bool, states: bool) -> Payload:
        flush_caches(self.shards)
        groups = list(by_dtype(live_tensors(self.shards, weights, states)).values())

        def gather(pooled: bool = False) -> list[torch.Tensor]:
            out = []
            for group in groups:
                parts = [t.reshape(-1) for t in group]
                numel, first = sum(p.numel() for p in parts), group[0]
                if not pooled:
                    out.append(torch.cat(parts))
                    continue
                buffer = self.pool.take((weights, states), numel, first.dtype, first.device)
                out.append(torch.cat(parts, out=buffer))
            return out

        def scatter(values: list[torch.Tensor]) -> None:
            with torch.no_grad():
                for group, flat in zip(groups, values, strict=True):
                    offset = 0
                    for tensor in group:
                        n = tensor.numel()
                        tensor.copy_(flat[offset : offset + n].view_as(tensor))
                        offset += n

        return Payload(buffers=gather(pooled=True), scatter=scatter, gather=gather)
