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


class SyncEngine(ABC):
    """Chooses the values of a replica sync."""

    def __init__(self, shards: list[ShardState], replica_pg: dist.ProcessGroup) -> None:
        self.shards = shards
        self.replica_pg = replica_pg

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

        def gather() -> list[torch.Tensor]:
            return [torch.cat([t.reshape(-1) for t in group]) for group in groups]

        def scatter(values: list[torch.Tensor]) -> None:
            with torch.no_grad():
                for group, flat in zip(groups, values, strict=True):
                    offset = 0
                    for tensor in group:
                        n = tensor.numel()
                        tensor.copy_(flat[offset : offset + n].view_as(tensor))
                        offset += n

        return Payload(buffers=gather(), scatter=scatter, gather=gather)
