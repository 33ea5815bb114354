"""The sync policy: when replicas are averaged, and how.

One small object owns the cadence so the trainer and users make a single call
per step (``policy.step(step)`` or ``model.maybe_sync(step)``). The injected
engine decides *which values* are averaged; the policy decides *when* (every N
steps), *how* (blocking, hidden behind the next lookup, delayed optimizer
state) and what to do around it (AdaGrad accumulator scaling,
replica divergence). ``sync_now`` is always a blocking sync that leaves the
replicas identical; hide and delay apply to cadence syncs only.

The policy composes its collaborators, each in the module of its concern: the engine
(``sync.engines``), the channel (``sync.transport``), the NaN/inf guard (``sync.guard``),
the plan of a sync (``sync.plan``), the averages in flight (``sync.landing``), folding into
DDP's all-reduce (``sync.ddp.folding``) and the variants (``sync.variants``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from sparse2d.sync.accumulator_scaling import AccumulatorScaler
from sparse2d.sync.ddp.fold import Folded
from sparse2d.sync.ddp.folding import Folding
from sparse2d.sync.divergence import DivergenceSampler
from sparse2d.sync.engines.auto import make_engine
from sparse2d.sync.engines.base import Payload, SyncEngine, metadata_bytes
from sparse2d.sync.guard import FiniteGuard, Verdict
from sparse2d.sync.landing import Landing, LandingPoint
from sparse2d.sync.options import SyncOptions, SyncReport
from sparse2d.sync.plan import Opening, Part, plan_sync
from sparse2d.sync.shards import ShardState, live_tensors
from sparse2d.sync.transport.channel import InWorldChannel, ReplicaChannel
from sparse2d.sync.transport.collectives import AllReduceHook
from sparse2d.sync.transport.transfer import Pending

__all__ = ["SyncOptions", "SyncPolicy", "SyncReport", "make_engine"]

if TYPE_CHECKING:
    from sparse2d.managed_collision.sync import ManagedCollisionSync
    from sparse2d.sync.ddp.carried_vote import CarriedVote, DdpVote


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
        global_pg: dist.ProcessGroup | None = None,
        mc: ManagedCollisionSync | None = None,
        channel: ReplicaChannel | None = None,
    ) -> None:
        self.options = options or SyncOptions()
        self.channel: ReplicaChannel = channel or InWorldChannel(replica_pg)
        """Where the averages travel and how a blocking part lands (``sync.transport.channel``):
        the in-world replica group, or torchft's managed group."""
        self.shards = shards
        self.mc = mc
        """Managed-collision tables (``sync.mc``): identities merged, rows averaged by id,
        blocking at every sync; ``shards`` holds the plain tables only."""
        self.replica_pg = replica_pg
        self.num_replicas = num_replicas
        self.hook = hook
        opts = self.options
        self.engine = engine or make_engine(opts.engine, shards, replica_pg)
        self.scaler = AccumulatorScaler(shards, num_replicas) if opts.momentum_scaling else None
        self._sampler: DivergenceSampler | None = None
        named = shards + (mc.shards if mc is not None else [])  # the guard names MC tables too
        self.guard = (
            FiniteGuard(named, global_pg or dist.group.WORLD) if opts.check_finite else None
        )
        self.landing = Landing(self.engine, self.scaler, self.channel)
        """Started parts and where they land (``sync.landing``)."""
        self.carrier: tuple[DdpVote, int] | None = None
        """The DDP carrier of this policy's NaN/inf vote and its slot
        (``sync.ddp.carried_vote``)."""
        self.votes_carried = 0
        """Syncs whose NaN/inf vote rode DDP's gradient all-reduce (no vote of their own)."""
        self.folding = Folding(shards, opts, self.engine, self.scaler)
        """Cadence syncs whose values ride DDP's gradient all-reduce (``sync.ddp.folding``)."""
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
        folded = self.folding.take(step)
        if folded is not None:  # its values rode DDP's all-reduce
            return self._land_folded(folded)
        opts = self.options
        return self._sync(
            step,
            states=opts.include_optimizer_state,
            async_states=opts.delayed_optimizer_state,
            hide=opts.hide,
        )

    def sync_now(self, step: int = -1, include_optimizer_state: bool = True) -> SyncReport:
        """Average replicas now, regardless of cadence; blocking, replicas identical after."""
        return self._sync(step, states=include_optimizer_state, async_states=False)

    @property
    def mode_counts(self) -> dict[str, int]:
        """Syncs per mode the engine ran (``engine="auto"``: what it chose); else empty."""
        return dict(getattr(self.engine, "counts", {}))

    @property
    def in_flight(self) -> bool:
        """A hidden sync has started and not landed yet (the next lookup will land it)."""
        return bool(self.landing.hidden)

    def land(self) -> float:
        """Land hidden syncs now, as the next lookup would (``LandingPoint.LOOKUP``): wait
        for their all-reduce and write the average back (exact)."""
        return self.landing.land(LandingPoint.LOOKUP)

    @property
    def may_scan_early(self) -> bool:
        """Guarded syncs whose payload can be known before they start: the dense engine, or
        ``auto`` while dense is its home; not delayed state."""
        return self.guard is not None and self._plain_cadence

    @property
    def _plain_cadence(self) -> bool:
        """Cadence syncs are plain averages of values known before they start: more than one
        replica, no managed-collision tables (merged and voted on by the sync itself), the
        dense or auto engine, no delayed state, and no early-lookup
        pipeline (the embedding update lands after DDP's backward)."""
        opts = self.options
        return (
            self.num_replicas > 1
            and self.mc is None
            and opts.engine in ("dense", "auto")
            and not opts.delayed_optimizer_state
            and not self.lookahead
        )

    def early_scan(self) -> tuple[list[torch.Tensor], bool] | None:
        """(tensors the next cadence sync may send, optimizer state included) for a NaN/inf
        vote carried by DDP; None when only the sync itself can tell (delayed state, touched
        rows)."""
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

    def _land_hook(self, module: torch.nn.Module, args: object) -> None:
        self.landing.land(LandingPoint.LOOKUP)

    def close(self) -> None:
        """Land what is in flight and remove this policy's hooks (and the engine's tracking)."""
        self.finish(LandingPoint.CLOSE)
        for handle in self._land_hooks:
            handle.remove()
        self._land_hooks.clear()
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()

    def finish(self, point: LandingPoint = LandingPoint.CALL) -> float:
        """Land everything in flight (hide/delay; what the channel holds settles
        first) at ``point``; return seconds spent waiting."""
        return self.landing.land(point)

    def measure_divergence(self) -> float:
        """Relative L2 distance of this replica to the replica mean (a small collective)."""
        if self._sampler is None:
            self._sampler = DivergenceSampler(self.shards, self.options.divergence_rows)
        return self._sampler.measure(self.replica_pg)

    def reset(self) -> None:
        """Forget per-sync references; call after loading weights or state into the shards."""
        self.finish(LandingPoint.CLOSE)
        if self.mc is not None:
            self.mc.reset()
        if self.scaler is not None:
            self.scaler.reset()
        if self.channel.members_change:  # loaded values may differ from the others' anywhere
            self.engine.diverged()

    # ---- folding into DDP's all-reduce (``sync.ddp.fold``: ``Foldable``) ---------------
    @property
    def may_fold(self) -> bool:
        """Cadence syncs may ride DDP's all-reduce: plain averages (dense or auto engine; no
        user all-reduce hook or delayed state)."""
        return self.hook is None and self._plain_cadence

    @property
    def folds(self) -> int:
        """Syncs whose values rode DDP's gradient all-reduce too."""
        return self.folding.folds

    def fold_numel(self, dtype: torch.dtype) -> int:
        return self.folding.numel(dtype)

    def fold_due(self, step: int) -> bool:
        return self.folding.due(step)

    def fold_begin(self, step: int) -> Folded | None:
        """Begin cadence sync ``step`` as a fold (``step()`` lands it); None when this policy
        cannot fold now."""
        return self.folding.begin(step, self._open) if self.may_fold else None

    def _land_folded(self, folded: Folded) -> SyncReport:
        if folded.error is not None:
            raise folded.error
        carried = self._take_vote(folded.states)
        if self.guard is not None:
            if carried is None:
                raise RuntimeError(f"sync of step {folded.step}: folded, but no vote came back")
            self.votes_carried += 1
            carried.settle(self.guard, folded.step, folded.states)
        return self.folding.land(folded)

    # ---- internals -------------------------------------------------------------------
    def _sync(
        self,
        step: int,
        *,
        states: bool,
        async_states: bool,
        hide: bool = False,
    ) -> SyncReport:
        """Open (land earlier transfers, divergence), managed-collision tables, plan, build
        every payload, vote on NaN/inf, start the averages, then land each part where the
        plan says."""
        self.folding.forget()
        if self.num_replicas == 1:
            return SyncReport(step=step, bytes=0, seconds=0.0)
        self.engine.track_rows(True)  # after folds: every row counts as touched
        opening = self._open(step)
        moved = self._sync_mc(step)
        if self.mc is not None and not self.shards:  # MC tables only: nothing else to send
            return opening.report(moved)
        plan = plan_sync(
            states=states,
            async_states=async_states,
            hide=hide,
            copies=self.channel.holds,
        )
        built = time.perf_counter()
        with torch.no_grad():  # every payload before any transfer: the guard sees them all
            payloads = [
                self.engine.payload(weights=p.weights, states=p.states, in_place=plan.in_place)
                for p in plan.parts
            ]
        verdict = self._vote(step, states, payloads)
        started = [self._begin(p, payload) for p, payload in zip(plan.parts, payloads, strict=True)]
        parts = [
            self.landing.start(part, pending, plan)
            for part, (pending, _) in zip(plan.parts, started, strict=True)
        ]
        self.landing.await_vote(verdict, plan, parts)
        for part, one, (_, sent) in zip(plan.parts, parts, started, strict=True):
            self.landing.place(part, one, plan)
            moved += sent
        self.landing.observe(built)
        return opening.report(moved)

    def _open(self, step: int) -> Opening:
        """Begin a sync (or a fold): land what is in flight, measure divergence when due."""
        began = time.perf_counter()
        waited = self.finish(LandingPoint.NEXT_SYNC)
        landed = self.landing.take_hidden_wait()
        self._syncs += 1
        every = self.options.divergence_every
        divergence = self.measure_divergence() if every and self._syncs % every == 0 else None
        return Opening(step, waited, landed, divergence, began)

    def _take_vote(self, states: bool) -> CarriedVote | None:
        """This sync's NaN/inf vote, if it rode DDP's all-reduce (``sync.ddp.carried_vote``)."""
        return self.carrier[0].take(self.carrier[1], states) if self.carrier else None

    def _vote(self, step: int, states: bool, payloads: list[Payload]) -> Verdict | None:
        """The job-wide NaN/inf vote on what this sync sends: settled now when it rode DDP's
        all-reduce or the payloads are live views (nothing is sent before the job agrees);
        else started, for ``Landing.await_vote``."""
        carried = self._take_vote(states)
        if self.guard is None:
            return None
        if carried is not None:  # voted in DDP's all-reduce
            self.votes_carried += 1
            carried.settle(self.guard, step, states)
            return None
        buffers = [b for p in payloads for b in p.buffers]
        verdict = self.guard.start(step, buffers, weights=True, states=states)
        if any(p.in_place for p in payloads):
            verdict.wait()
            return None
        return verdict

    def _sync_mc(self, step: int) -> int:
        """Managed-collision tables first, blocking: a job-wide NaN/inf vote on every table
        (plain ones too, so nothing moves if any is bad), then identities merged and rows
        averaged by id (``sync.mc``), landed by the channel like any blocking part. Returns
        the bytes sent."""
        if self.mc is None:
            return 0
        with torch.no_grad():
            if self.guard is not None:
                tensors = live_tensors(self.mc.shards + self.shards, True, True)
                self.guard.check(step, tensors, weights=True, states=True)
            sent, write = self.mc.prepare()
            self.landing.hand(write)
            return sent

    def _begin(self, part: Part, payload: Payload) -> tuple[Pending, int]:
        """Start averaging one payload into its copy buffers; nothing is written back until
        it lands (``sync.landing``). Returns the transfer and the bytes it sends."""
        with torch.no_grad():
            snapshot = [b.clone() for b in payload.buffers] if part.background else None
            sent = payload.bytes + metadata_bytes(self.engine)
            reduction = self.channel.start(payload.buffers, self.hook, async_op=True)
        kind = "states" if part.states else "weights"
        return Pending(payload, reduction, snapshot, kind), sent
