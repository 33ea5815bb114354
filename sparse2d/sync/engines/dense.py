"""The dense engine: every row of every shard, one flat buffer per dtype and kind.

The plain replica average (what TorchRec's 2D sync does) and the fallback of ``engine="auto"``.
"""

from __future__ import annotations

import torch

from sparse2d.sync.engines.base import Payload, SyncEngine, in_place_payload
from sparse2d.sync.shards import by_dtype, flush_caches, live_tensors


class DenseEngine(SyncEngine):
    """Every row of every shard: one flat buffer per dtype and kind."""

    def payload(self, weights: bool, states: bool, in_place: bool = False) -> Payload:
        flush_caches(self.shards)
        live = live_tensors(self.shards, weights, states)
        direct = in_place_payload(live) if in_place else None
        if direct is not None:
            return direct
        groups = list(by_dtype(live).values())

        def gather(pooled: bool = False) -> list[torch.Tensor]:
            out = []
            for group in groups:
                parts, numel = [], 0
                for tensor in group:
                    parts.append(tensor.reshape(-1))
                    numel += tensor.numel()
                buffer = None
                if pooled:
                    first = group[0]
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
