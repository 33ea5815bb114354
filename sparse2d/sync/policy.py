"""The sync policy: when replicas are averaged, and how.

One small object owns the cadence so the trainer and users make a single call
per step (``policy.step(step)`` or ``model.maybe_sync(step)``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from sparse2d.errors import ConfigError
from sparse2d.sync.collectives import AllReduceHook, average_
from sparse2d.sync.engine import DenseEngine, SyncEngine
from sparse2d.sync.tensors import ShardState


@dataclass(kw_only=True, slots=True)
class SyncOptions:
    """How and when replicas are synchronized."""

    every: int = 1
    """Average replicas every N optimizer steps (local SGD in between)."""
    include_optimizer_state: bool = True
    """Average fused optimizer state (accumulators, momenta) along with the weights."""

    def __post_init__(self) -> None:
        if not isinstance(self.every, int) or self.every < 1:
            raise ConfigError(f"sync every={self.every!r} must be an int >= 1 (1 = every step).")


@dataclass(slots=True)
class SyncReport:
    """What one sync did on this rank."""

    step: int
    bytes: int
    seconds: float


class SyncPolicy:
    """Runs replica syncs for a ``DMPCollection`` according to ``SyncOptions``."""

    def __init__(
        self,
        shards: list[ShardState],
        replica_pg: dist.ProcessGroup,
        num_replicas: int,
        options: SyncOptions | None = None,
        hook: AllReduceHook | None = None,
        engine: SyncEngine | None = None,
    ) -> None:
        self.options = options or SyncOptions()
        self.replica_pg = replica_pg
        self.num_replicas = num_replicas
        self.hook = hook
        self.engine = engine or DenseEngine(shards, replica_pg)

    def step(self, step: int) -> SyncReport | None:
        """Call after optimizer step ``step`` (0-based); syncs when ``step + 1`` is a multiple of N."""
        if (step + 1) % self.options.every != 0:
            return None
        return self.sync_now(step, self.options.include_optimizer_state)

    def sync_now(self, step: int = -1, include_optimizer_state: bool = True) -> SyncReport:
        """Average replicas now, regardless of cadence."""
        if self.num_replicas == 1:
            return SyncReport(step=step, bytes=0, seconds=0.0)
        start = time.perf_counter()
        with torch.no_grad():
            payload = self.engine.payload(weights=True, states=include_optimizer_state)
            average_(payload.buffers, self.replica_pg, self.hook)
            payload.scatter(payload.buffers)
        self.engine.synced(weights=True, states=include_optimizer_state)
        return SyncReport(step=step, bytes=payload.bytes, seconds=time.perf_counter() - start)

    def finish(self) -> None:
        """Complete any sync still in flight (none in exact mode)."""
