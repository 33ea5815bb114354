"""Sparse replica sync: average only the rows some replica touched since the last sync.

Untouched rows are identical on every replica, so a sync's cost follows the rows touched,
not the table size. How replicas agree on the rows (counts, id lists or bitmaps, the dense
fallback above ``crossover``, delayed state's bases, fault tolerance's channel):
docs/sync_strategies.md, "How the touched-rows engines agree on rows".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from sparse2d.errors import ConfigError
from sparse2d.sync.engines.base import Payload, RowSelection, SyncEngine
from sparse2d.sync.engines.rows import row_payload
from sparse2d.sync.engines.touched import TouchedRows
from sparse2d.sync.shards import ShardState, flush_caches

DEFAULT_CROSSOVER = 0.5
"""Union fraction of a shard's rows above which it is synced densely: a little below the
measured crossover (bench/RESULTS.md, sparse replica sync: 0.69-0.75 for 10^5- and 10^6-row
tables), where the two cost the same and timings are noisy."""

WEIGHTS, STATES = "weights", "states"


@dataclass(slots=True)
class SparseStats:
    """What the last ``payload`` decided on this rank."""

    rows_total: int = 0
    """Rows of the selected shards (counted once per kind)."""
    rows_synced: int = 0
    """Rows in the payload (counted once per kind)."""
    dense_shards: int = 0
    """Shards synced in full because the union was dense enough."""
    metadata_bytes: int = 0
    """Bytes this rank sent for agreeing on the union (counts, ids, bitmaps)."""
    unions_by_ids: int = 0
    """(shard, kind-base) unions agreed by all-gathering id lists."""
    unions_by_bitmap: int = 0
    """(shard, kind-base) unions agreed by a MAX all-reduce of bitmaps."""


class SparseEngine(SyncEngine):
    """Touched-row replica sync with automatic per-shard dense fallback."""

    def __init__(
        self,
        shards: list[ShardState],
        replica_pg: dist.ProcessGroup | None,
        *,
        crossover: float = DEFAULT_CROSSOVER,
        channel: Any = None,
    ) -> None:
        if not 0.0 <= crossover <= 1.0:
            raise ConfigError(
                f"sparse sync crossover={crossover!r} must be a fraction in [0, 1] "
                f"(default {DEFAULT_CROSSOVER}; 1.0 = never fall back to dense)."
            )
        super().__init__(shards, replica_pg)
        self.crossover = crossover
        self.tracker = TouchedRows(shards)
        self.stats = SparseStats()
        self._base = {WEIGHTS: 0, STATES: 0}
        self._pending: dict[str, int] = {}
        self.lookahead = False
        """A pipeline looks up batch ``i+1`` before batch ``i``'s sync and updates those rows
        after it (``TrainPipelineSemiSync``): each base then lags one sync (``synced``)."""
        self._previous_cut = {WEIGHTS: 0, STATES: 0}
        self.channel = channel
        """torchft's managed group (fault tolerance): metadata rides its all-reduces."""
        self._diverged = False  # replicas may differ anywhere: the next agreement is dense
        self._world_replicas = 0 if channel is not None else dist.get_world_size(replica_pg)
        self._device = shards[0].weight.device if shards else torch.device("cpu")
        """Where the metadata collectives run (the kernels' device: NCCL needs CUDA tensors)."""
        self.unions: dict[tuple[int, int], torch.Tensor | None] = {}
        """The last ``payload``'s agreed union per (shard, base); ``None`` = synced densely."""
        self.gathered_extra: list[list[int]] = []
        """Every replica's ``piggyback()`` values from the last union agreement."""
        self.count_sums: dict[tuple[int, int], int] = {}
        """Touched rows per (shard, base) summed over replicas, from the last agreement."""

    @property
    def _replicas(self) -> int:
        """Replicas averaged: the replica group's, or under fault tolerance the quorum's."""
        return self.channel.size if self.channel is not None else self._world_replicas

    def diverged(self) -> None:
        """Replica values may differ outside the touched rows (a dropped sync part, a heal):
        the next agreement syncs every shard densely on every replica."""
        self._diverged = True

    # ---- SyncEngine ---------------------------------------------------------------------
    def payload(self, weights: bool, states: bool, in_place: bool = False) -> Payload:
        flush_caches(self.shards)
        cut = self.tracker.cut()
        kinds = [k for k, on in ((WEIGHTS, weights), (STATES, states)) if on]
        for kind in kinds:
            self._pending[kind] = cut
        bases = sorted({self._base[k] for k in kinds})
        stats = SparseStats()
        rows = self._agree(bases, stats)  # (shard, base) -> union rows, None = all rows
        self.unions = rows
        entries: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        for want in kinds:
            for i, shard in enumerate(self.shards):
                for kind, tensors in self._kinds(shard, want == WEIGHTS, want == STATES):
                    selected = rows[(i, self._base[kind])]
                    stats.rows_total += shard.rows
                    stats.rows_synced += shard.rows if selected is None else selected.numel()
                    stats.dense_shards += int(selected is None and shard.rows > 0)
                    if selected is None or selected.numel() > 0:
                        entries += [(t, selected) for t in tensors]
        self.stats = stats
        payload = row_payload(entries, pool=(self.pool, tuple(kinds)))
        if states:
            base = self._base[STATES]
            payload.state_rows = [
                RowSelection(i, 0, shard.rows, rows[(i, base)])
                for i, shard in enumerate(self.shards)
            ]
        return payload

    def synced(self, weights: bool, states: bool) -> None:
        """Advance each synced kind's base to the cut of its payload; under ``lookahead``
        to the cut before it, since rows looked up just before this sync are updated after
        it and so must stay pending for the next one."""
        for kind, on in ((WEIGHTS, weights), (STATES, states)):
            if on:
                cut = self._pending.pop(kind, None)
                cut = cut if cut is not None else self.tracker.cut()
                self._diverged = False
                previous, self._previous_cut[kind] = self._previous_cut[kind], cut
                self._base[kind] = previous if self.lookahead else cut

    def share_touched(self, shards: list[ShardState], pg: dist.ProcessGroup) -> int:
        """Count as touched here the rows of ``shards`` (some of this engine's) that any
        member of ``pg`` touched since the oldest kind's base: replicas inside a world whose
        values an exact in-world average just mixed (fault tolerance's stage 1,
        ``sparse2d.ft.in_world``), so the next agreement also sends rows only they touched.
        Collective over ``pg``; returns the bytes sent."""
        index = {id(shard): i for i, shard in enumerate(self.shards)}
        missing = [s.table for s in shards if id(s) not in index]
        if missing:
            raise ConfigError(
                f"share_touched: shards of {missing} are not this engine's (pass shards the "
                "engine was built over)"
            )
        base = min(self._base.values())
        return self.tracker.share([index[id(s)] for s in shards], base, pg)

    def piggyback(self) -> list[int]:
        """Integers sent along with the touched-row counts (none here; see ``AutoEngine``)."""
        return []

    def close(self) -> None:
        """Stop tracking (removes the forward hooks)."""
        self.tracker.close()

    # ---- internals ----------------------------------------------------------------------
    @staticmethod
    def _kinds(
        shard: ShardState, weights: bool, states: bool
    ) -> list[tuple[str, list[torch.Tensor]]]:
        out = []
        if weights:
            out.append((WEIGHTS, [shard.weight]))
        if states and shard.optimizer_states:
            out.append((STATES, list(shard.optimizer_states)))
        return out

    def _agree(
        self, bases: list[int], stats: SparseStats
    ) -> dict[tuple[int, int], torch.Tensor | None]:
        """Union of touched rows per (shard, base) over the replica group (None = dense).

        ``piggyback()`` values ride along with the counts; every replica's copy lands in
        ``self.gathered_extra`` (identical on all replicas, so usable for agreed decisions).
        """
        keys = [(i, b) for b in bases for i in range(len(self.shards))]
        if not keys:
            return {}
        local = {key: self.tracker.rows_since(*key) for key in keys}
        extra = self.piggyback()
        counts = torch.tensor(
            [local[k].numel() for k in keys] + [int(self._diverged)] + extra,
            dtype=torch.int64,
            device=self._device,
        )
        stacked, meta = self._gather(counts)
        if stacked is None:  # a failed collective: nothing agreed, nothing sent
            return self._nothing(keys, stats, meta)
        n = len(keys)
        self.gathered_extra = stacked[:, n + 1 :].tolist()
        summed = stacked[:, :n].sum(0).tolist()
        self.count_sums = dict(zip(keys, summed, strict=True))
        max_counts = stacked[:, :n].amax(0).tolist()
        dense_all = bool(stacked[:, n].any())  # some replica diverged: every shard in full
        result: dict[tuple[int, int], torch.Tensor | None] = {}
        by_ids, by_bitmap = [], []
        for key, most in zip(keys, max_counts, strict=True):
            rows = self.shards[key[0]].rows
            if dense_all:
                result[key] = None
            elif most == 0:
                result[key] = torch.empty(0, dtype=torch.int64, device=self._device)
            elif most > self.crossover * rows:
                result[key] = None
            elif 4 * most * self._replicas < rows:
                by_ids.append((key, most))
            else:
                by_bitmap.append(key)
        if by_ids:
            meta += self._union_by_ids(by_ids, local, result)
        if by_bitmap:
            meta += self._union_by_bitmap(by_bitmap, local, result)
        if self.channel is not None and self.channel.failed:
            return self._nothing(keys, stats, meta)
        for key, union in list(result.items()):
            if union is not None and union.numel() > self.crossover * self.shards[key[0]].rows:
                result[key] = None
        stats.metadata_bytes = meta
        stats.unions_by_ids, stats.unions_by_bitmap = len(by_ids), len(by_bitmap)
        return result

    def _gather(self, tensor: torch.Tensor) -> tuple[torch.Tensor | None, int]:
        """Every replica's ``tensor`` stacked (None when the collective failed), and the
        bytes this rank handed to the collective."""
        if self.channel is None:
            every = [torch.empty_like(tensor) for _ in range(self._replicas)]
            dist.all_gather(every, tensor, group=self.replica_pg)
            return torch.stack(every), tensor.numel() * tensor.element_size()
        slots, _ = self.channel.all_gather(tensor)
        sent = len(slots) * tensor.numel() * tensor.element_size()
        return (None if self.channel.failed else torch.stack(slots)), sent

    def _nothing(
        self, keys: list[tuple[int, int]], stats: SparseStats, meta: int
    ) -> dict[tuple[int, int], torch.Tensor | None]:
        """No rows for any key: the sync of a step whose collectives failed (the step's
        vote fails; the replicas stay diverged until a sync lands)."""
        self._diverged = True
        stats.metadata_bytes = meta
        return {key: torch.empty(0, dtype=torch.int64, device=self._device) for key in keys}

    def _union_by_ids(
        self,
        wanted: list[tuple[tuple[int, int], int]],
        local: dict[tuple[int, int], torch.Tensor],
        result: dict[tuple[int, int], torch.Tensor | None],
    ) -> int:
        dtype = (
            torch.int32 if max(self.shards[k[0]].rows for k, _ in wanted) < 2**31 else torch.int64
        )
        padded = torch.cat(
            [
                torch.nn.functional.pad(local[k].to(dtype), (0, most - local[k].numel()), value=-1)
                for k, most in wanted
            ]
        )
        stacked, sent = self._gather(padded)
        if stacked is None:  # failed: ``_agree`` sends nothing
            return sent
        offset = 0
        for key, most in wanted:
            ids = stacked[:, offset : offset + most].reshape(-1)
            result[key] = torch.unique(ids[ids >= 0]).to(torch.int64)
            offset += most
        return sent

    def _union_by_bitmap(
        self,
        wanted: list[tuple[int, int]],
        local: dict[tuple[int, int], torch.Tensor],
        result: dict[tuple[int, int], torch.Tensor | None],
    ) -> int:
        sizes = [self.shards[k[0]].rows for k in wanted]
        bitmap = torch.zeros(sum(sizes), dtype=torch.uint8, device=self._device)
        offset = 0
        for key, size in zip(wanted, sizes, strict=True):
            bitmap[offset + local[key]] = 1
            offset += size
        if self.channel is None:
            dist.all_reduce(bitmap, op=dist.ReduceOp.MAX, group=self.replica_pg)
        else:
            sent = bitmap.numel() * (1 if self.channel.size < 256 else 4)
            bitmap = self.channel.any(bitmap).to(torch.uint8)
            if self.channel.failed:  # ``_agree`` sends nothing
                return sent
        offset = 0
        for key, size in zip(wanted, sizes, strict=True):
            result[key] = torch.nonzero(bitmap[offset : offset + size]).squeeze(1)
            offset += size
        return bitmap.numel()
