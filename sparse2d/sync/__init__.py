"""Replica synchronization: which tensors, which collectives, and when."""

from sparse2d.sync.collectives import AllReduceHook, average_, broadcast_
from sparse2d.sync.tensors import (
    ShardState,
    collect_shard_states,
    find_fused_kernels,
    live_tensors,
)

__all__ = [
    "AllReduceHook",
    "ShardState",
    "average_",
    "broadcast_",
    "collect_shard_states",
    "find_fused_kernels",
    "live_tensors",
]
