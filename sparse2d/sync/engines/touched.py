"""Which embedding rows were looked up (and so updated) since a given sync.

A forward pre-hook on every FBGEMM TBE stamps the rows it is about to look up with the
current generation: the ids after TorchRec's input all-to-all, local to each shard, exactly
the rows the fused backward updates (a row's optimizer state with it). Stamps rather than
bitmaps let each consumer keep its own base generation (weights and delayed optimizer state)
at the cost of one ``int32`` per row and no host synchronization.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    SplitTableBatchedEmbeddingBagsCodegen,
)
from torch.utils.hooks import RemovableHandle

from sparse2d.sync.shards import ShardState


class TouchedRows:
    """Per-row "last touched" generation stamps for the shards of fused kernels."""

    def __init__(self, shards: list[ShardState]) -> None:
        self.generation = 1
        """Stamp given to rows looked up from now on; ``cut()`` advances it."""
        self.paused = False
        """Lookups are not stamped (``pause``); ``resume`` then counts every row touched."""
        self._stamps: dict[int, torch.Tensor] = {}
        self._handles: list[RemovableHandle] = []
        self._views: list[torch.Tensor] = []
        spans = []  # per shard: (kernel key, first row, end row) in the kernel's stamps
        for shard in shards:
            tbe = shard.kernel
            if tbe is None:
                raise TypeError(f"shard of table {shard.table!r} has no FBGEMM kernel to track")
            if id(tbe) not in self._stamps:
                self._install(tbe)
            view = self._table_view(tbe, shard)
            self._views.append(view)
            spans.append((id(tbe), view.storage_offset() - self._stamps[id(tbe)].storage_offset()))
        # ``counts_since`` reads every shard's count off one prefix sum per kernel:
        # kernel k's sums start at ``base[k]`` in the concatenation (each with a leading 0).
        base, offset = {}, 0
        for key, stamps in self._stamps.items():
            base[key], offset = offset, offset + stamps.numel() + 1
        device = next(iter(self._stamps.values())).device if self._stamps else None
        starts = [base[key] + first for key, first in spans]
        ends = [start + view.numel() for start, view in zip(starts, self._views, strict=True)]
        self._span_index = torch.tensor([starts, ends], dtype=torch.int64, device=device)

    def _install(self, tbe: SplitTableBatchedEmbeddingBagsCodegen) -> None:
        # One slot past the last row is a sink for positions outside any feature.
        stamps = torch.zeros(
            tbe.total_hash_size + 1, dtype=torch.int32, device=tbe.hash_size_cumsum.device
        )
        self._stamps[id(tbe)] = stamps
        self._handles.append(
            tbe.register_forward_pre_hook(self._make_hook(stamps), with_kwargs=True)
        )

    def _table_view(
        self, tbe: SplitTableBatchedEmbeddingBagsCodegen, shard: ShardState
    ) -> torch.Tensor:
        rows = [int(spec[0]) for spec in tbe.embedding_specs]
        starts = [0, *accumulate(rows)]
        t = shard.index_in_kernel
        if rows[t] != shard.rows:
            raise RuntimeError(
                f"table {shard.table!r}: kernel has {rows[t]} rows at index {t}, shard {shard.rows}"
            )
        return self._stamps[id(tbe)][starts[t] : starts[t] + rows[t]]

    def _make_hook(self, stamps: torch.Tensor) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if self.paused:
                return
            indices = args[0] if len(args) > 0 else kwargs["indices"]
            offsets = args[1] if len(args) > 1 else kwargs["offsets"]
            vbe = args[4] if len(args) > 4 else kwargs.get("batch_size_per_feature_per_rank")
            mark(module, stamps, indices, offsets, vbe, self.generation)  # type: ignore[arg-type]

        return hook

    def cut(self) -> int:
        """Close the current generation: rows stamped so far are ``<= cut``, later ones above."""
        cut = self.generation
        self.generation += 1
        return cut

    def pause(self) -> None:
        """Stop stamping lookups (their cost) while no sync needs to know touched rows."""
        self.paused = True

    def resume(self) -> None:
        """Stamp lookups again; rows looked up while paused are unknown, so every row is
        marked touched now (the next touched-rows sync covers them all)."""
        if self.paused:
            self.paused = False
            for stamps in self._stamps.values():
                stamps.fill_(self.generation)

    def mark_rows(self, shard_index: int, rows: torch.Tensor | None = None) -> None:
        """Mark rows changed outside a lookup (e.g. loaded or repaired); ``None`` = all rows."""
        view = self._views[shard_index]
        if rows is None:
            view.fill_(self.generation)
        else:
            view.index_fill_(0, rows.to(device=view.device, dtype=torch.int64), self.generation)

    def share(self, indices: list[int], base: int, pg: dist.ProcessGroup) -> int:
        """Stamp here the rows of shards ``indices`` that any member of ``pg`` touched after
        ``base`` (one MAX all-reduce of a uint8 bitmap), for values that an average over
        ``pg`` just mixed. Collective over ``pg``; returns the bytes sent."""
        if not indices:
            return 0
        bitmap = torch.cat([(self._views[i] > base).to(torch.uint8) for i in indices])
        dist.all_reduce(bitmap, op=dist.ReduceOp.MAX, group=pg)
        offset = 0
        for i in indices:
            rows = self._views[i].numel()
            self.mark_rows(i, torch.nonzero(bitmap[offset : offset + rows]).squeeze(1))
            offset += rows
        return bitmap.numel()

    def union_since(
        self, spans: list[tuple[int, int, int]], base: int, pg: dist.ProcessGroup | None
    ) -> list[torch.Tensor]:
        """Per ``(shard index, start, end)`` span: the rows (from ``start``) that any member of
        ``pg`` touched after generation ``base`` (one MAX all-reduce of a uint8 bitmap; a
        streamed sync's fragment, ``sparse2d.sync.stream``). Collective over ``pg``."""
        if not spans:
            return []
        parts = [(self._views[i][a:b] > base).to(torch.uint8) for i, a, b in spans]
        bitmap = torch.cat(parts)
        dist.all_reduce(bitmap, op=dist.ReduceOp.MAX, group=pg)
        rows, offset = [], 0
        for _, a, b in spans:
            rows.append(torch.nonzero(bitmap[offset : offset + b - a]).squeeze(1))
            offset += b - a
        return rows

    def rows_since(self, shard_index: int, base: int) -> torch.Tensor:
        """Sorted local row ids (int64) of shard ``shard_index`` touched after generation ``base``."""
        return torch.nonzero(self._views[shard_index] > base).squeeze(1)

    def count_since(self, shard_index: int, base: int) -> int:
        return int((self._views[shard_index] > base).sum())

    def counts_since(self, base: int) -> torch.Tensor:
        """Rows touched after generation ``base``, per shard (int64, on the stamps' device).

        A few ops per kernel however many shards it holds, and no host sync: cheap enough
        to run on every sync.
        """
        if not self._views:
            return torch.zeros(0, dtype=torch.int64)
        sums = []
        for stamps in self._stamps.values():
            sums += [stamps.new_zeros(1, dtype=torch.int64), torch.cumsum(stamps > base, 0)]
        flat = torch.cat(sums)
        return flat[self._span_index[1]] - flat[self._span_index[0]]

    def close(self) -> None:
        """Remove the forward hooks; stamps stop changing."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def mark(
    tbe: SplitTableBatchedEmbeddingBagsCodegen,
    stamps: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    batch_size_per_feature_per_rank: list[list[int]] | None,
    generation: int,
) -> None:
    """Stamp the kernel-global rows of ``indices`` (TBE forward inputs) with ``generation``.

    ``offsets`` has one entry per bag plus one, bags ordered feature-major: ``B`` bags per
    feature, or ``sum(batch_size_per_feature_per_rank[f])`` bags for feature ``f`` (VBE).
    Feature ``f`` reads rows of table ``feature_table_map[f]``, which start at
    ``hash_size_cumsum[f]`` in the kernel's flat row space. Ids outside a table are marked
    as its row 0, where FBGEMM's bounds check redirects them.
    """
    num_features = len(tbe.feature_table_map)
    device = stamps.device
    if indices.numel() == 0 or num_features == 0:
        return
    if batch_size_per_feature_per_rank is None:
        per_feature = (offsets.numel() - 1) // num_features
        bag_bounds = torch.arange(num_features + 1, device=device) * per_feature
    else:
        counts = [sum(batches) for batches in batch_size_per_feature_per_rank]
        bag_bounds = torch.tensor([0, *accumulate(counts)], device=device)
    index_bounds = offsets.to(device=device, dtype=torch.int64)[bag_bounds]
    positions = torch.arange(indices.numel(), device=device)
    feature = torch.searchsorted(index_bounds, positions, right=True) - 1
    in_bags = (feature >= 0) & (feature < num_features)
    feature = feature.clamp_(0, num_features - 1)
    ids = indices.to(device=device, dtype=torch.int64)
    valid = (ids >= 0) & (ids < tbe.rows_per_table[feature])
    rows = tbe.hash_size_cumsum[feature] + torch.where(valid, ids, 0)
    sink = stamps.numel() - 1
    stamps.index_fill_(0, torch.where(in_bags, rows, sink), generation)
