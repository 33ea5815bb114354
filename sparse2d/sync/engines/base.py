"""Sync engines decide *which values* are averaged; the policy decides *when and how*.

An engine turns the live shards into a ``Payload``: contiguous buffers that are
safe to all-reduce (also asynchronously), plus ``scatter`` to write averaged values back
and ``gather`` to re-read the live values at the same positions (for delayed state's delta
correction).
``engines.dense`` covers every row, ``engines.sparse`` touched rows only and
``engines.auto`` picks between them per sync.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.distributed as dist

from sparse2d.sync.shards import ShardState


class RowSelection(NamedTuple):
    """Rows ``start:end`` of local shard ``shard`` (an index into the engine's shards); only
    ``rows`` (counted from ``start``) where given."""

    shard: int
    start: int
    end: int
    rows: torch.Tensor | None = None


@dataclass(slots=True)
class Payload:
    """Values to average over the replica group and where they live."""

    buffers: list[torch.Tensor]
    """Contiguous copies, at most one per dtype and kind; averaged in place by the policy."""
    scatter: Callable[[list[torch.Tensor]], None]
    """Write tensors shaped like ``buffers`` back into the live shards."""
    gather: Callable[[], list[torch.Tensor]]
    """Fresh copies of the live values at the positions of ``buffers``."""
    state_rows: list[RowSelection] | None = None
    """The optimizer-state rows averaged (None: every row). Momentum scaling rescales exactly
    these: when a part lands after training went on, the other rows may hold updates made
    meanwhile, which are no average's growth."""
    in_place: bool = False
    """``buffers`` are views of the live shards: averaging writes them directly (no copies),
    so the NaN/inf vote must pass before anything is sent (``SyncPolicy`` waits for it)."""

    @property
    def bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers)


IN_PLACE_MIN_BYTES = 4 << 20
"""Dense payloads from this size on are averaged in place (they wait for the NaN/inf vote,
then send); smaller ones go through copies so the vote runs beside the transfer. The measured
crossover: docs/advisor_cost_model.md (copies win at 1.1 MB per rank, in place from 5.3 MB)."""


def flat_views(tensors: list[torch.Tensor]) -> list[torch.Tensor] | None:
    """The fewest flat views covering exactly ``tensors``, or None when they do not tile
    their storages (non-contiguous, overlapping, or with gaps between them).

    A fused kernel keeps all its tables' weights (and each optimizer state) in one flat
    buffer, so a dense sync of every shard is usually one view per kernel and kind.
    """
    by_storage: dict[tuple[int, torch.dtype], list[torch.Tensor]] = {}
    for tensor in tensors:
        if not tensor.is_contiguous():
            return None
        key = (tensor.untyped_storage().data_ptr(), tensor.dtype)
        by_storage.setdefault(key, []).append(tensor)
    views = []
    for group in by_storage.values():
        group.sort(key=lambda t: t.storage_offset())
        start = end = group[0].storage_offset()
        for tensor in group:
            if tensor.storage_offset() != end:
                return None
            end += tensor.numel()
        views.append(torch.as_strided(group[0], (end - start,), (1,), start))
    return views


def in_place_payload(tensors: list[torch.Tensor]) -> Payload | None:
    """A payload averaging ``tensors`` where they live, if they tile their storages and are
    large enough (``IN_PLACE_MIN_BYTES``) for the saved copies to matter; else None."""
    nbytes = 0
    for tensor in tensors:
        nbytes += tensor.numel() * tensor.element_size()
    if nbytes < IN_PLACE_MIN_BYTES:
        return None
    views = flat_views(tensors)
    if views is None:
        return None
    return Payload(
        buffers=views,
        scatter=lambda values: None,  # the averages are already in place
        gather=lambda: [v.clone() for v in views],
        in_place=True,
    )


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
    def payload(self, weights: bool, states: bool, in_place: bool = False) -> Payload:
        """Collect the values to average. May run metadata collectives on ``replica_pg``.

        ``in_place``: the caller allows a payload of live views (``Payload.in_place``).
        """

    def synced(self, weights: bool, states: bool) -> None:  # noqa: B027 (optional hook)
        """Called after a sync of (weights, states) completed; engines reset tracking here."""

    def diverged(self) -> None:  # noqa: B027 (optional hook)
        """Replica values may now differ anywhere (a dropped sync part, a heal):
        touched-row engines sync every row next time."""

    def observe(self, seconds: float) -> None:  # noqa: B027 (optional hook)
        """The sync's exposed time (build, waits, write-back), once it landed; cost models
        learn from it (``AutoEngine``)."""
