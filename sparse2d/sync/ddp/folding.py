"""The sync policy's folding collaborator: what a folded cadence sync sends, and landing
the average DDP's gradient all-reduce brings back (``sync.ddp.fold``).

``SyncPolicy`` holds one ``Folding`` and decides whether a sync may fold (its options);
this object names the values, keeps the fold in flight between ``begin`` (inside DDP's
backward) and ``SyncPolicy.step`` (after the optimizer step), and writes the average back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from sparse2d.sync.ddp.fold import Folded, write_back
from sparse2d.sync.landing import LandingPoint, Started, WriteBack
from sparse2d.sync.options import SyncOptions, SyncReport
from sparse2d.sync.shards import ShardState, flush_caches, live_tensors

if TYPE_CHECKING:
    from sparse2d.sync.accumulator_scaling import AccumulatorScaler
    from sparse2d.sync.engines.base import SyncEngine
    from sparse2d.sync.plan import Opening


class Folding:
    """One sync policy's folds: the one in flight, and how many landed."""

    def __init__(
        self,
        shards: list[ShardState],
        options: SyncOptions,
        engine: SyncEngine,
        scaler: AccumulatorScaler | None,
    ) -> None:
        self.shards = shards
        self.options = options
        self.engine = engine
        self.scaler = scaler
        self.folds = 0
        """Syncs whose values rode DDP's gradient all-reduce."""
        self._folded: Folded | None = None

    def numel(self, dtype: torch.dtype) -> int:
        """Elements a folded cadence sync sends from this rank; -1 if some are not ``dtype``."""
        tensors = live_tensors(self.shards, True, self.options.include_optimizer_state)
        if any(t.dtype != dtype for t in tensors):
            return -1
        return sum(t.numel() for t in tensors)

    def due(self, step: int) -> bool:
        return (step + 1) % self.options.every == 0

    def begin(self, step: int, open_sync: Callable[[int], Opening]) -> Folded:
        """Begin cadence sync ``step`` as a fold: ``open_sync`` lands what is in flight and
        measures divergence when due, then the live values (the dense engine's payload) are
        named. Never raises: the all-reduce must go on, so an error is kept in the result
        and raised by ``SyncPolicy.step``."""
        folded = Folded(step=step, states=self.options.include_optimizer_state)
        self._folded = folded
        try:
            opening = open_sync(step)
            folded.waited = opening.waited + opening.landed
            folded.divergence = opening.divergence
            flush_caches(self.shards)
            folded.tensors = live_tensors(self.shards, True, folded.states)
        except Exception as error:  # noqa: BLE001 (raised again by ``SyncPolicy.step``)
            folded.error = error
        folded.build_s = time.perf_counter() - folded.began
        return folded

    def take(self, step: int) -> Folded | None:
        """The fold of cadence sync ``step``, if it rode DDP's all-reduce; forgets any other."""
        folded, self._folded = self._folded, None
        return folded if folded is not None and folded.step == step else None

    def forget(self) -> None:
        """A sync that is not folded runs: a fold never landed (another policy's sync raised
        first) is stale."""
        self._folded = None

    def land(self, folded: Folded) -> SyncReport:
        """Write the average back, once its NaN/inf vote passed (``SyncPolicy``)."""
        if folded.mean is None:
            raise RuntimeError(
                f"sync of step {folded.step}: some rank could not fold its values into DDP's "
                "all-reduce (its own error says why); no replica changed."
            )
        begin = time.perf_counter()
        part = Started(WriteBack(lambda: write_back(folded)), landed=lambda: self._landed(folded))
        part.land(LandingPoint.SYNC)  # the same state machine as every other sync part
        self.folds += 1
        return SyncReport(
            step=folded.step,
            bytes=folded.mean.numel() * folded.mean.element_size(),
            seconds=folded.build_s + time.perf_counter() - begin,
            divergence=folded.divergence,
            wait_seconds=folded.waited,
        )

    def _landed(self, folded: Folded) -> None:
        """What landing a fold does: rows in sync, tracking paused, accumulators scaled."""
        self.engine.synced(weights=True, states=folded.states)
        self.engine.track_rows(False)  # until a sync that is not folded (``SyncPolicy._sync``)
        if folded.states and self.scaler is not None:
            self.scaler.apply()
