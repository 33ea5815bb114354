"""The sync policy: when replicas are averaged, and how.

One small object owns the cadence so the trainer and users make a single call
per step (``policy.step(step)`` or ``model.maybe_sync(step)``). The injected
engine decides *which values* are averaged; the policy decides *when* (every N
steps), *how* (blocking, overlapped with the next interval, delayed optimizer
state, bf16 deltas) and what to do around it (AdaGrad accumulator scaling,
replica divergence). ``sync_now`` is always a blocking sync that leaves the
replicas identical; overlap and delay apply to cadence syncs only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from sparse2d.errors import ConfigError, SyncError
from sparse2d.sync.ddp.fold import Folded
from sparse2d.sync.ddp.folding import FoldingPolicy
from sparse2d.sync.engines.auto import make_engine
from sparse2d.sync.engines.base import Payload, SyncEngine, metadata_bytes
from sparse2d.sync.engines.dense import DenseEngine
from sparse2d.sync.guard import FiniteGuard, Verdict
from sparse2d.sync.options import SyncOptions, SyncReport
from sparse2d.sync.shards import ShardState, live_tensors
from sparse2d.sync.transport.channel import InWorldChannel, ManagedChannel, ReplicaChannel
from sparse2d.sync.transport.collectives import AllReduceHook
from sparse2d.sync.transport.transfer import Pending, Reduction
from sparse2d.sync.variants.compression import Bf16DeltaCompressor
from sparse2d.sync.variants.divergence import DivergenceSampler
from sparse2d.sync.variants.scaling import AccumulatorScaler

__all__ = ["SyncOptions", "SyncPolicy", "SyncReport", "make_engine"]

if TYPE_CHECKING:
    from sparse2d.sync.ddp.vote import DdpVote
    from sparse2d.sync.mc.sync import ManagedCollisionSync


class SyncPolicy(FoldingPolicy):
    """Runs replica syncs for a ``DMPCollection`` according to ``SyncOptions``."""

    def __init__(
        self,
        shards: list[ShardState],
        replica_pg: dist.ProcessGroup,
        num_replicas: int,
        options: SyncOptions | None = None,
        hook: AllReduceHook | None = None,
        engine: SyncEngine | None = None,
        global_pg: dist.ProcessGroup | None = None,
        mc: ManagedCollisionSync | None = None,
        channel: ReplicaChannel | None = None,
    ) -> None:
        self.options = options or SyncOptions()
        self.channel: ReplicaChannel = channel or InWorldChannel(replica_pg)
        """Where the averages travel (``sync.transport.channel``): the in-world replica group, or
        torchft's managed group, whose averages wait in copies for the step's commit."""
        self._uncommitted: list[tuple[Pending, bool, bool]] = []  # (transfer, weights, states)
        self._mc_land: Callable[[], None] | None = None  # a deferred MC merge, for ``commit``
        self.shards = shards
        self.mc = mc
        """Managed-collision tables (``sync.mc``): identities merged, rows averaged by id,
        blocking at every sync; ``shards`` holds the plain tables only."""
        self.replica_pg = replica_pg
        self.num_replicas = num_replicas
        self.hook = hook
        opts = self.options
        kind = "dense" if opts.engine == "auto" and opts.compression == "bf16" else opts.engine
        self.engine = engine or make_engine(kind, shards, replica_pg)
        if opts.compression == "bf16" and not isinstance(self.engine, DenseEngine):
            raise ConfigError(
                f"sync compression='bf16' needs the dense engine; got "
                f"{type(self.engine).__name__}. Use compression='none' or the dense engine."
            )
        self.compressor = Bf16DeltaCompressor() if opts.compression == "bf16" else None
        self.scaler = AccumulatorScaler(shards, num_replicas) if opts.momentum_scaling else None
        self._sampler: DivergenceSampler | None = None
        named = shards + (mc.shards if mc is not None else [])  # the guard names MC tables too
        self.guard = (
            FiniteGuard(named, global_pg or dist.group.WORLD) if opts.check_finite else None
        )
        self._pending: list[Pending] = []
        self._hidden: list[Pending] = []
        self._verdict: Verdict | None = (
            None  # the NaN/inf vote of the hidden sync, waited in ``land``
        )
        self.carrier: tuple[DdpVote, int] | None = None
        """The DDP carrier of this policy's NaN/inf vote and its slot (``sync.ddp.vote``)."""
        self.votes_carried = 0
        """Syncs whose NaN/inf vote rode DDP's gradient all-reduce (no vote of their own)."""
        self.folds = 0
        """Syncs whose values rode DDP's gradient all-reduce too (``sync.ddp.fold``)."""
        self._folded: Folded | None = None
        self._hidden_wait = 0.0
        self._hidden_exposed = 0.0  # build + start time of the hidden sync in flight
        self._syncs = 0
        self.lookahead = False
        """Set by ``look_ahead`` (an early-lookup pipeline drives the model)."""
        kernels = {id(s.kernel): s.kernel for s in shards if s.kernel is not None}
        self._land_hooks = [k.register_forward_pre_hook(self._land_hook) for k in kernels.values()]

    # ---- public ----------------------------------------------------------------------
    def step(self, step: int) -> SyncReport | None:
        """Call after optimizer step ``step`` (0-based); syncs when ``step + 1`` is a multiple of N."""
        if (step + 1) % self.options.every != 0:
            return None
        folded, self._folded = self._folded, None
        if folded is not None and folded.step == step:  # its values rode DDP's all-reduce
            return self._land_folded(folded)
        opts = self.options
        return self._sync(
            step,
            states=opts.include_optimizer_state,
            async_weights=opts.overlap,
            async_states=opts.overlap or opts.delayed_optimizer_state,
            hide=opts.hide,
        )

    def sync_now(self, step: int = -1, include_optimizer_state: bool = True) -> SyncReport:
        """Average replicas now, regardless of cadence; blocking, replicas identical after."""
        return self._sync(
            step, states=include_optimizer_state, async_weights=False, async_states=False
        )

    @property
    def mode_counts(self) -> dict[str, int]:
        """Syncs per mode the engine ran (``engine="auto"``: what it chose); else empty."""
        return dict(getattr(self.engine, "counts", {}))

    @property
    def in_flight(self) -> bool:
        """A hidden sync has started and not landed yet (the next lookup will land it)."""
        return bool(self._hidden)

    def land(self) -> float:
        """Land hidden syncs: wait for their all-reduce and write the average back (exact).

        Runs before every fused-kernel forward; call it before reading the embeddings.
        """
        if not self._hidden:
            return 0.0
        begin = time.perf_counter()
        waited = 0.0
        hidden, self._hidden = self._hidden, []
        verdict, self._verdict = self._verdict, None
        if verdict is not None:
            try:
                verdict.wait()
            except SyncError:
                self._abandon(hidden)
                raise
        for transfer in hidden:
            waited += transfer.complete()
            if transfer.kind == "states" and self.scaler is not None:
                self.scaler.apply()
        self._hidden_wait += waited
        self.engine.observe(self._hidden_exposed + time.perf_counter() - begin)
        return waited

    @property
    def may_scan_early(self) -> bool:
        """Guarded syncs whose payload can be known before they start: the dense engine, or
        ``auto`` while dense is its home; not bf16 deltas, overlap or delayed state."""
        opts = self.options
        return (
            self.guard is not None
            and self.num_replicas > 1
            and self.mc is None  # MC rows are voted on by the sync itself
            and opts.engine in ("dense", "auto")
            and self.compressor is None
            and not (opts.overlap or opts.delayed_optimizer_state)
            and not self.lookahead  # the embedding update lands after DDP's backward
        )

    def early_scan(self) -> tuple[list[torch.Tensor], bool] | None:
        """(tensors the next cadence sync may send, optimizer state included) for a NaN/inf
        vote carried by DDP; None when only the sync itself can tell (bf16 deltas, overlap,
        delayed state, touched rows)."""
        if self.guard is None or self.num_replicas == 1:
            return [], True
        if not self.may_scan_early:
            return None
        states = self.options.include_optimizer_state
        tensors = self.engine.early_scan(weights=True, states=states)
        return None if tensors is None else (tensors, states)

    def look_ahead(self) -> None:
        """A pipeline looks up the next batch before this batch's sync and applies the
        embedding update after DDP's backward (TorchRec's ``TrainPipelineSemiSync``):
        touched-row engines keep those rows pending one more sync, and nothing runs inside
        DDP's backward (no early sync, carried vote or fold: they would see the embeddings
        before their update)."""
        self.lookahead = True
        if hasattr(self.engine, "lookahead"):
            self.engine.lookahead = True

    @property
    def uncommitted(self) -> bool:
        """Averages of a deferred channel wait for the step's commit (``commit``/``discard``)."""
        return bool(self._uncommitted) or self._mc_land is not None

    def commit(self) -> None:
        """The step committed: write the averages held in copies back into the shards."""
        land, self._mc_land = self._mc_land, None
        if land is not None:  # merged identities and rows averaged by id
            land()
        if self.scaler is not None:  # c = the replicas averaged: under FT, the quorum's
            self.scaler.factor = float(getattr(self.channel, "size", self.num_replicas))
        pending, self._uncommitted = self._uncommitted, []
        for transfer, weights, states in pending:
            transfer.complete()
            self.engine.synced(weights=weights, states=states)
            if states and self.scaler is not None:
                self.scaler.apply()

    def discard(self) -> None:
        """The step failed its commit: drop the averages, every shard keeps its own values."""
        self._mc_land = None
        pending, self._uncommitted = self._uncommitted, []
        self._abandon([transfer for transfer, _, _ in pending])
        if pending:  # groups that committed it hold other values in its rows
            self.engine.diverged()

    def _land_hook(self, module: torch.nn.Module, args: object) -> None:
        self.land()

    def close(self) -> None:
        """Land what is in flight and remove this policy's hooks (and the engine's tracking)."""
        self.finish()
        for handle in self._land_hooks:
            handle.remove()
        self._land_hooks.clear()
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()

    def finish(self) -> float:
        """Land transfers still in flight (hide/overlap/delay); return seconds spent waiting."""
        waited = self.land()
        pending, self._pending = self._pending, []
        for transfer in pending:
            waited += transfer.complete()
            if transfer.kind == "states" and self.scaler is not None:
                self.scaler.apply()
        return waited

    def measure_divergence(self) -> float:
        """Relative L2 distance of this replica to the replica mean (a small collective)."""
        if self._sampler is None:
            self._sampler = DivergenceSampler(self.shards, self.options.divergence_rows)
        return self._sampler.measure(self.replica_pg)

    def reset(self) -> None:
        """Forget per-sync references; call after loading weights or state into the shards."""
        self.finish()
        if self.mc is not None:
            self.mc.reset()
        if self.compressor is not None:
            self.compressor.reset()
        if self.scaler is not None:
            self.scaler.reset()
        if self.channel.deferred:  # loaded values (a heal) may differ from the others' anywhere
            self.engine.diverged()

    # ---- internals -------------------------------------------------------------------
    def _sync(
        self,
        step: int,
        *,
        states: bool,
        async_weights: bool,
        async_states: bool,
        hide: bool = False,
    ) -> SyncReport:
        self._folded = None  # never landed (another policy's sync raised first): stale
        if self.num_replicas == 1:
            return SyncReport(step=step, bytes=0, seconds=0.0)
        self.engine.track_rows(True)  # after folds: every row counts as touched
        start = time.perf_counter()
        waited = self.finish()
        landed, self._hidden_wait = self._hidden_wait, 0.0  # the last hidden sync's wait
        self._syncs += 1
        divergence = None
        every = self.options.divergence_every
        if every and self._syncs % every == 0:
            divergence = self.measure_divergence()
        mc_bytes = self._sync_mc(step)
        if self.mc is not None and not self.shards:  # MC tables only: nothing else to send
            return SyncReport(
                step=step,
                bytes=mc_bytes,
                seconds=time.perf_counter() - start + landed,
                divergence=divergence,
                wait_seconds=waited + landed,
            )
        if states and async_weights == async_states:
            # One payload for both kinds: one collective per dtype, as few copies as possible.
            parts = [("all", True, True, async_weights)]
        else:
            parts = [("weights", True, False, async_weights)]
            parts += [("states", False, True, async_states)] if states else []
        built = time.perf_counter()
        # Live views may be averaged in place unless the payload must stay a private copy:
        # compression rewrites it, an overlapped transfer runs while training writes shards.
        in_place = (
            self.compressor is None
            and not self.channel.deferred
            and not any(async_op for *_, async_op in parts)
        )
        with torch.no_grad():  # every payload before any transfer: the guard sees them all
            payloads = [
                self.engine.payload(weights=w, states=s, in_place=in_place) for _, w, s, _ in parts
            ]
        verdict = None
        carried = self.carrier[0].take(self.carrier[1], states) if self.carrier else None
        if self.guard is not None and carried is not None:  # voted in DDP's all-reduce
            self.votes_carried += 1
            carried.settle(self.guard, step, states)
        elif self.guard is not None:
            buffers = [b for p in payloads for b in p.buffers]
            verdict = self.guard.start(step, buffers, weights=True, states=states)
            if any(p.in_place for p in payloads):  # nothing is sent before the job agrees
                verdict.wait()
                verdict = None
        started = [
            self._begin(key, payload, states=s, async_op=async_op)
            for (key, _, s, async_op), payload in zip(parts, payloads, strict=True)
        ]
        hide = hide and not any(async_op for *_, async_op in parts)
        if verdict is not None and hide:  # voted on in the background too; ``land`` waits
            self._verdict = verdict
        elif verdict is not None:  # the averages landed in copies only; write back if finite
            try:
                verdict.wait()
            except SyncError:
                self._abandon([pending for pending, _ in started])
                raise
        moved = mc_bytes
        for (_, w, s, async_op), (pending, sent) in zip(parts, started, strict=True):
            moved += sent
            if async_op:  # tracking restarts now: updates from here on are the next delta
                self.engine.synced(weights=w, states=s)
                self._pending.append(pending)
                continue
            if hide:  # lands as is before the next lookup (``land``): exact
                self.engine.synced(weights=w, states=s)
                self._hidden.append(pending)
                continue
            if self.channel.deferred:  # written back by ``commit`` once the step commits
                self._uncommitted.append((pending, w, s))
                continue
            pending.complete()
            self.engine.synced(weights=w, states=s)
            if s and self.scaler is not None:
                self.scaler.apply()
        if self._hidden:  # the rest of its exposed time is the landing wait (``land``)
            self._hidden_exposed = time.perf_counter() - built
        else:
            self.engine.observe(time.perf_counter() - built)
        return SyncReport(
            step=step,
            bytes=moved,
            seconds=time.perf_counter() - start + landed,
            divergence=divergence,
            wait_seconds=waited + landed,
        )

    def _sync_mc(self, step: int) -> int:
        """Managed-collision tables first, blocking: a job-wide NaN/inf vote on every table
        (plain ones too, so nothing moves if any is bad), then identities merged and rows
        averaged by id (``sync.mc``). Returns the bytes sent."""
        if self.mc is None:
            return 0
        with torch.no_grad():
            if self.guard is not None:
                tensors = live_tensors(self.mc.shards + self.shards, True, True)
                self.guard.check(step, tensors, weights=True, states=True)
            if not self.channel.deferred:
                return self.mc.sync()
            sent, self._mc_land = self.mc.prepare()
            return sent

    def _begin(
        self, key: str, payload: Payload, *, states: bool, async_op: bool
    ) -> tuple[Pending, int]:
        """Start averaging one payload into its copy buffers; nothing is written back until
        ``Pending.complete``. Returns the transfer and the bytes it sends."""
        with torch.no_grad():
            snapshot = [b.clone() for b in payload.buffers] if async_op else None
            sent = (
                self.compressor.wire_bytes(key, payload.buffers)
                if self.compressor is not None
                else payload.bytes
            ) + metadata_bytes(self.engine)
            reduction = self._start(key, payload.buffers, async_op=True)
        return Pending(payload, reduction, snapshot, "states" if states else "weights"), sent

    def _abandon(self, started: list[Pending]) -> None:
        """Drain refused transfers without writing back (the process groups stay usable)."""
        for pending in started:
            pending.reduction.wait()
        if self.compressor is not None:  # its references took the refused averages
            self.compressor.reset()

    def _start(self, key: str, buffers: list[torch.Tensor], async_op: bool) -> Reduction:
        if self.compressor is not None:
            managed = self.channel if isinstance(self.channel, ManagedChannel) else None
            return self.compressor.start(
                key, buffers, self.replica_pg, self.hook, async_op, channel=managed
            )
        return self.channel.start(buffers, self.hook, async_op)
