"""The streamed sync's fragments: every row of the local shards cut into ``every`` slices of
about equal bytes, one averaged per step, so the host links carry a steady load instead of
one burst per interval (``SyncOptions.stream``; torchft's Streaming DiLoCo does the same for a
language model's layers).

A fragment is a list of row ranges (``RowSpan``) of the local shards; a row's weight and its
optimizer state travel together in the same fragment. Every member of a replica group holds
the same shards, so each cuts the same fragments: nothing is agreed at run time. With a
touched-rows engine (``sparse``, ``auto``) a fragment sends only the rows some replica looked
up since that fragment's last sync: the others are identical on every replica already.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

from sparse2d.sync.engines.base import BufferPool, Payload, RowSelection
from sparse2d.sync.engines.rows import row_bytes, row_payload
from sparse2d.sync.engines.touched import TouchedRows
from sparse2d.sync.shards import ShardState, flush_caches


class RowSpan(NamedTuple):
    """Rows ``start:end`` of local shard ``shard`` (an index into the policy's shards)."""

    shard: int
    start: int
    end: int


def split_rows(shards: list[ShardState], count: int) -> list[list[RowSpan]]:
    """``count`` fragments of about equal bytes (weights and optimizer state together),
    in shard order; a fragment may be empty when there are fewer rows than fragments."""
    sizes = []
    for shard in shards:
        per_row = row_bytes(shard.weight) + sum(row_bytes(s) for s in shard.optimizer_states)
        sizes.append(per_row)
    total = sum(shard.rows * size for shard, size in zip(shards, sizes, strict=True))
    fragments: list[list[RowSpan]] = [[] for _ in range(count)]
    done = 0  # bytes placed so far
    for index, (shard, size) in enumerate(zip(shards, sizes, strict=True)):
        row = 0
        while row < shard.rows:
            current = min(count - 1, done * count // total) if total else 0
            # rows until this fragment's share ends (at least one row)
            share_end = (current + 1) * total // count
            take = shard.rows - row if size == 0 else max(1, -(-(share_end - done) // size))
            take = min(take, shard.rows - row)
            fragments[current].append(RowSpan(index, row, row + take))
            row += take
            done += take * size
    return fragments


class Stream:
    """One policy's stream: its fragments and, with touched rows, each fragment's base."""

    def __init__(
        self, shards: list[ShardState], every: int, tracker: TouchedRows | None = None
    ) -> None:
        self.shards = shards
        self.fragments = split_rows(shards, every)
        self.tracker = tracker
        """Touched rows (the engine's): a fragment sends the rows touched since its base."""
        self.bases = [0] * every
        """Per fragment, the generation its last sync cut (0: since the replicas were aligned;
        -1: every row, after values diverged)."""
        self.lookahead = False
        """Rows were looked up before the last sync and are updated after it (TorchRec's
        ``TrainPipelineSemiSync``): a base lags one cut so those rows stay pending."""
        self._last_cut = 0
        self.metadata_bytes = 0
        """Bytes the last payload's agreement on touched rows sent (its bitmap)."""

    def payload(
        self, index: int, states: bool, pool: BufferPool, pg: dist.ProcessGroup | None
    ) -> Payload:
        """Fragment ``index``'s rows (touched ones only with a tracker: one small collective
        over ``pg`` agrees on them) copied into one pooled buffer per dtype."""
        spans = self.fragments[index]
        rows: list[torch.Tensor | None] = [None] * len(spans)
        if self.tracker is not None and spans:
            cut = self.tracker.cut()
            union = self.tracker.union_since(spans, self.bases[index], pg)
            self.metadata_bytes = sum(s.end - s.start for s in spans)
            rows = [r if r.numel() < s.end - s.start else None for r, s in zip(union, spans)]
            self.bases[index] = self._last_cut if self.lookahead else cut
            self._last_cut = cut
        payload = span_payload(self.shards, spans, states, pool, rows)
        if states:
            payload.state_rows = [RowSelection(*s, r) for s, r in zip(spans, rows, strict=True)]
        return payload

    def diverged(self) -> None:
        """Replica values may differ anywhere (a dropped fragment): each sends every row next."""
        self.bases = [-1] * len(self.bases)


def span_payload(
    shards: list[ShardState],
    spans: list[RowSpan],
    states: bool,
    pool: BufferPool,
    rows: list[torch.Tensor | None] | None = None,
) -> Payload:
    """The rows of ``spans`` (weights, and optimizer state when ``states``; per span only
    ``rows`` from its start where given) copied into one pooled buffer per dtype; ``scatter``
    writes averaged rows back, ``gather`` re-reads them."""
    flush_caches(shards)
    entries: list[tuple[torch.Tensor, torch.Tensor | None]] = []
    for span, selected in zip(spans, rows or [None] * len(spans), strict=True):
        shard = shards[span.shard]
        if selected is not None and selected.numel() == 0:
            continue
        entries.append((shard.weight[span.start : span.end], selected))
        if states:
            for state in shard.optimizer_states:
                entries.append((state[span.start : span.end], selected))
    return row_payload(entries, pool=(pool, "stream"))
