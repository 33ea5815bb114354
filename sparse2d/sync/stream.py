"""The streamed sync's fragments: every row of the local shards cut into ``every`` slices of
about equal bytes, one averaged per step, so the host links carry a steady load instead of
one burst per interval (``SyncOptions.stream``; torchft's Streaming DiLoCo does the same for a
language model's layers).

A fragment is a list of row ranges (``RowSpan``) of the local shards; a row's weight and its
optimizer state travel together in the same fragment. Every member of a replica group holds
the same shards, so each cuts the same fragments: nothing is agreed at run time.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from sparse2d.sync.engines.base import BufferPool, Payload
from sparse2d.sync.engines.rows import row_bytes, row_payload
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


def span_payload(
    shards: list[ShardState], spans: list[RowSpan], states: bool, pool: BufferPool
) -> Payload:
    """The rows of ``spans`` (weights, and optimizer state when ``states``) copied into one
    pooled buffer per dtype; ``scatter`` writes averaged rows back, ``gather`` re-reads them."""
    flush_caches(shards)
    entries: list[tuple[torch.Tensor, torch.Tensor | None]] = []
    for span in spans:
        shard = shards[span.shard]
        entries.append((shard.weight[span.start : span.end], None))
        if states:
            for state in shard.optimizer_states:
                entries.append((state[span.start : span.end], None))
    return row_payload(entries, pool=(pool, "stream"))
