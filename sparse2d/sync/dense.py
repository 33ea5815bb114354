"""Full replica sync: average every shard's weights and optimizer state over the replica group."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from sparse2d.sync.collectives import AllReduceHook, average_
from sparse2d.sync.tensors import ShardState, flush_caches


@dataclass(slots=True)
class SyncStats:
    """What one sync moved and how long it took on this rank."""

    bytes: int = 0
    """Payload bytes this rank contributed to the replica all-reduce."""
    seconds: float = 0.0


def tensor_bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def weight_tensors(shards: list[ShardState]) -> list[torch.Tensor]:
    return [s.weight for s in shards]


def state_tensors(shards: list[ShardState]) -> list[torch.Tensor]:
    return [t for s in shards for t in s.optimizer_states]


def full_sync(
    shards: list[ShardState],
    replica_pg: dist.ProcessGroup,
    include_optimizer_state: bool = True,
    hook: AllReduceHook | None = None,
) -> SyncStats:
    """Average all weights (and optimizer states) in place; one all-reduce per dtype each."""
    start = time.perf_counter()
    flush_caches(shards)
    weights = weight_tensors(shards)
    average_(weights, replica_pg, hook)
    moved = tensor_bytes(weights)
    if include_optimizer_state:
        states = state_tensors(shards)
        if states:
            average_(states, replica_pg, hook)
            moved += tensor_bytes(states)
    return SyncStats(bytes=moved, seconds=time.perf_counter() - start)
