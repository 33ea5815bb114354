"""Replica divergence: how far this replica drifted from the replica mean before a sync.

``||w_local - w_avg|| / ||w_avg||`` over a fixed random sample of rows of every
local shard. The sample is drawn once from a seeded generator over the shard
list, which is identical on all replicas of a sharding group, so every replica
samples the same rows and the metric costs one small all-reduce.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from sparse2d.comm_device import flag_device
from sparse2d.sync.shards import ShardState, flush_caches


class DivergenceSampler:
    """Measures the relative L2 distance of this replica to the replica average."""

    def __init__(self, shards: list[ShardState], rows_per_shard: int, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.shards = shards
        self.rows = [  # with replacement: O(k) per shard, whatever the table size
            torch.randint(0, max(s.rows, 1), (min(rows_per_shard, s.rows),), generator=generator)
            for s in shards
        ]

    def measure(self, pg: dist.ProcessGroup) -> float:
        """Relative L2 distance (0.0 for identical replicas); a collective on ``pg``."""
        flush_caches(self.shards)
        with torch.no_grad():
            parts = [s.weight[rows].float().reshape(-1) for s, rows in zip(self.shards, self.rows)]
            local = torch.cat(parts) if parts else torch.zeros(0, device=flag_device(pg))
            mean = local.clone()
            dist.all_reduce(mean, op=dist.ReduceOp.AVG, group=pg)
            scale = float(mean.norm())
            distance = float((local - mean).norm())
        return distance / scale if scale > 0 else distance
