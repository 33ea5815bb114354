"""Coalesced replica-group collectives used by sync, alignment and repair."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from sparse2d.sync.shards import by_dtype

AllReduceHook = Callable[[list[torch.Tensor], dist.ProcessGroup], None]
"""A user all-reduce: averages the given same-dtype tensors in place over the given group."""


def average_(
    tensors: list[torch.Tensor], pg: dist.ProcessGroup, hook: AllReduceHook | None = None
) -> None:
    """Average ``tensors`` in place over ``pg`` with one coalesced all-reduce per dtype."""
    for group in by_dtype(tensors).values():
        if hook is not None:
            hook(group, pg)
            continue
        opts = dist.AllreduceCoalescedOptions()
        opts.reduceOp = dist.ReduceOp.AVG
        pg.allreduce_coalesced(group, opts).wait()


def broadcast_(tensors: list[torch.Tensor], pg: dist.ProcessGroup, src_group_rank: int = 0) -> None:
    """Overwrite ``tensors`` in place with the copy held by ``src_group_rank`` of ``pg``."""
    src = dist.get_global_rank(pg, src_group_rank)
    for group in by_dtype(tensors).values():
        flat = _flatten_dense_tensors(group)
        dist.broadcast(flat, src=src, group=pg)
        for tensor, value in zip(group, _unflatten_dense_tensors(flat, group), strict=True):
            tensor.copy_(value)
