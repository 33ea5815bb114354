"""The sync policy's side of ``sync.ddp.fold``: may a cadence sync ride DDP's gradient
all-reduce, what does it send, and landing the average DDP brings back.

Mixed into ``SyncPolicy`` (it implements ``sync.ddp.fold.Foldable``); kept apart so the policy
module holds the sync itself. It reads the policy's options, shards, engine and guard.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from sparse2d.sync.ddp.fold import Folded, write_back
from sparse2d.sync.options import SyncOptions, SyncReport
from sparse2d.sync.shards import ShardState, flush_caches, live_tensors

if TYPE_CHECKING:
    from sparse2d.sync.ddp.vote import DdpVote
    from sparse2d.sync.engines.base import SyncEngine
    from sparse2d.sync.guard import FiniteGuard
    from sparse2d.sync.mc.sync import ManagedCollisionSync
    from sparse2d.sync.transport.collectives import AllReduceHook
    from sparse2d.sync.variants.compression import Bf16DeltaCompressor
    from sparse2d.sync.variants.scaling import AccumulatorScaler


class FoldingPolicy:
    """Folding for ``SyncPolicy``: the attributes below are the policy's own, and so are
    the ``finish`` and ``measure_divergence`` it calls."""

    options: SyncOptions
    shards: list[ShardState]
    num_replicas: int
    mc: ManagedCollisionSync | None
    hook: AllReduceHook | None
    compressor: Bf16DeltaCompressor | None
    engine: SyncEngine
    guard: FiniteGuard | None
    scaler: AccumulatorScaler | None
    carrier: tuple[DdpVote, int] | None
    lookahead: bool
    votes_carried: int
    folds: int
    _folded: Folded | None
    _hidden_wait: float
    _syncs: int

    @property
    def may_fold(self) -> bool:
        """Cadence syncs may ride DDP's all-reduce: plain averages (dense or auto engine; no
        user all-reduce hook, bf16 deltas, overlap or delayed state)."""
        opts = self.options
        return (
            self.num_replicas > 1
            and self.mc is None  # MC rows need their identities merged first
            and opts.engine in ("dense", "auto")
            and self.hook is None
            and self.compressor is None
            and not (opts.overlap or opts.delayed_optimizer_state)
            and not self.lookahead  # the embedding update lands after DDP's backward
        )

    def fold_numel(self, dtype: torch.dtype) -> int:
        """Elements a folded cadence sync sends from this rank; -1 if some are not ``dtype``."""
        tensors = live_tensors(self.shards, True, self.options.include_optimizer_state)
        if any(t.dtype != dtype for t in tensors):
            return -1
        return sum(t.numel() for t in tensors)

    def fold_due(self, step: int) -> bool:
        return (step + 1) % self.options.every == 0

    def fold_begin(self, step: int) -> Folded | None:
        """Begin cadence sync ``step`` as a fold: land what is in flight, measure divergence
        when due, name the live values (the dense engine's payload); ``step()`` lands the
        average. None when this policy cannot fold now. Never raises: the all-reduce must
        go on, so an error is kept in the result and raised by ``step()``."""
        if not self.may_fold:
            return None
        folded = Folded(step=step, states=self.options.include_optimizer_state)
        self._folded = folded
        try:
            folded.waited = self.finish()
            landed, self._hidden_wait = self._hidden_wait, 0.0
            folded.waited += landed
            self._syncs += 1
            every = self.options.divergence_every
            if every and self._syncs % every == 0:
                folded.divergence = self.measure_divergence()
            flush_caches(self.shards)
            folded.tensors = live_tensors(self.shards, True, folded.states)
        except Exception as error:  # noqa: BLE001 (raised again by ``step``)
            folded.error = error
        folded.build_s = time.perf_counter() - folded.began
        return folded

    def _land_folded(self, folded: Folded) -> SyncReport:
        if folded.error is not None:
            raise folded.error
        carried = self.carrier[0].take(self.carrier[1], folded.states) if self.carrier else None
        if self.guard is not None:
            if carried is None:
                raise RuntimeError(f"sync of step {folded.step}: folded, but no vote came back")
            self.votes_carried += 1
            carried.settle(self.guard, folded.step, folded.states)
        if folded.mean is None:
            raise RuntimeError(
                f"sync of step {folded.step}: some rank could not fold its values into DDP's "
                "all-reduce (its own error says why); no replica changed."
            )
        begin = time.perf_counter()
        write_back(folded)
        self.engine.synced(weights=True, states=folded.states)
        self.engine.track_rows(False)  # until a sync that is not folded (``_sync``)
        if folded.states and self.scaler is not None:
            self.scaler.apply()
        self.folds += 1
        return SyncReport(
            step=folded.step,
            bytes=folded.mean.numel() * folded.mean.element_size(),
            seconds=folded.build_s + time.perf_counter() - begin,
            divergence=folded.divergence,
            wait_seconds=folded.waited,
        )
