"""A started sync part's life, and the one list of the points that land it.

Every part of a sync (``sync.plan``) is a ``Started`` state machine::

    started --------------------------> landed | dropped
    started --> held (by its channel) --> landed | dropped

It lands (``Started.land``: wait, write back with delta correction, then what landing does:
mark the rows synced, scale the AdaGrad accumulators) at exactly one ``LandingPoint``, or is
dropped (``Started.drop``: drained, never written back; every replica keeps its own values).
Where it waits is decided once: a blocking part is handed to its channel (``hand``: a plain
channel lands it now, a holding one keeps it until it releases or drops it), a background
part (delayed state) waits for the next sync, a hidden one for the next lookup.
``Landing.land(point)`` is the one way in for the parts the policy keeps; a fold
(``sync.ddp.folding``) lands through a ``Started`` of its own at ``SYNC``.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from sparse2d.errors import SyncError

if TYPE_CHECKING:
    from sparse2d.sync.accumulator_scaling import AccumulatorScaler
    from sparse2d.sync.engines.base import SyncEngine
    from sparse2d.sync.guard import Verdict
    from sparse2d.sync.plan import Part, SyncPlan


class LandingPoint(enum.Enum):
    """Every point where a started sync part can land; nothing else lands one."""

    SYNC = "sync"
    """The sync that started it, before it returns: a blocking part (``Channel.hand``
    of a channel that holds nothing)."""
    NEXT_SYNC = "next sync"
    """The next sync or fold, as it begins (``SyncPolicy._open``): everything in flight."""
    LOOKUP = "lookup"
    """The fused kernels' forward pre-hook, before the next lookup, or a caller landing early
    what that hook would (``SyncPolicy.land``): hidden parts only; background ones run on."""
    SURFACE = "surface"
    """A surface that reads or replaces the tables (``state_dict``, ``load_state_dict``, the
    fused optimizer's; ``SurfaceGuard``): everything in flight."""
    CALL = "call"
    """An explicit ``SyncPolicy.finish`` (the trainer before it evaluates or ends, a
    checkpoint, a repair, a trial's close): everything in flight."""
    CLOSE = "close"
    """``SyncPolicy.close`` and ``reset`` (after a load): everything in flight."""
    RELEASE = "release"
    """The channel that held the part lets it land (only it can)."""


class PartState(enum.Enum):
    STARTED = "started"
    HELD = "held"
    """Kept by its channel, which alone decides: release (land) or drop."""
    LANDED = "landed"
    DROPPED = "dropped"


class Transfer(Protocol):
    """What a started part moves: ``complete`` writes the average back, ``drain`` waits for
    the collective without writing anything (``transfer.Pending``, ``WriteBack``)."""

    def complete(self) -> float: ...

    def drain(self) -> None: ...


class WriteBack:
    """A part whose collectives already ran (the MC identity merge, ``ManagedCollisionSync
    .prepare``): landing runs ``write``; dropping has nothing to wait for."""

    def __init__(self, write: Callable[[], None]) -> None:
        self._write = write

    def complete(self) -> float:
        self._write()
        return 0.0

    def drain(self) -> None:
        return None


class Carrier(Protocol):
    """What landing needs of a channel (``sync.transport.channel.Channel``)."""

    @property
    def size(self) -> int | None: ...

    def hand(self, started: Started) -> None: ...

    def settle(self) -> None: ...


class Started:
    """One started part of a sync and what landing or dropping it does.

    Landing a landed part again, or dropping a dropped one, does nothing (``land`` returns
    0.0): every point may ask. Landing a dropped part, dropping a landed one, and landing a
    held part anywhere but at ``RELEASE`` raise ``RuntimeError`` (a caller's bug: the
    replicas would no longer hold what the others think).
    """

    def __init__(
        self,
        transfer: Transfer,
        landed: Callable[[], None] | None = None,
        dropped: Callable[[bool], None] | None = None,
    ) -> None:
        self.transfer = transfer
        self._landed = landed
        """Runs after the write-back (mark synced, scale)."""
        self._dropped = dropped
        """Runs after a drop, given whether the part was held (another replica may have
        landed it, so values may now differ anywhere)."""
        self.state = PartState.STARTED
        self.point: LandingPoint | None = None
        """Where it landed."""

    def hold(self) -> None:
        """Its channel keeps it: only ``land(RELEASE)`` or ``drop`` end it."""
        if self.state is not PartState.STARTED:
            raise RuntimeError(f"a {self.state.value} sync part cannot be held")
        self.state = PartState.HELD

    def land(self, point: LandingPoint) -> float:
        """Wait for the average, write it back, run what landing does; seconds waited."""
        if self.state is PartState.LANDED:
            return 0.0
        if self.state is PartState.DROPPED:
            raise RuntimeError(f"a dropped sync part cannot land (at {point.value})")
        if self.state is PartState.HELD and point is not LandingPoint.RELEASE:
            raise RuntimeError(
                f"a held sync part lands when its channel releases it, not at {point.value}"
            )
        waited = self.transfer.complete()
        self.state, self.point = PartState.LANDED, point
        if self._landed is not None:
            self._landed()
        return waited

    def drop(self) -> None:
        """Drain without writing back (the process groups stay usable); each replica keeps
        its own values."""
        if self.state is PartState.DROPPED:
            return
        if self.state is PartState.LANDED:
            point = self.point.value if self.point else "?"
            raise RuntimeError(f"a sync part that landed (at {point}) cannot be dropped")
        held = self.state is PartState.HELD
        self.transfer.drain()
        self.state = PartState.DROPPED
        if self._dropped is not None:
            self._dropped(held)


class Landing:
    """The started parts one sync policy keeps (background, hidden), and how every part
    lands or is dropped."""

    def __init__(
        self,
        engine: SyncEngine,
        scaler: AccumulatorScaler | None,
        channel: Carrier,
    ) -> None:
        self.engine = engine
        self.scaler = scaler
        self.channel = channel
        self.background: list[Started] = []
        """Delayed parts: every point but ``LOOKUP`` lands them."""
        self.hidden: list[Started] = []
        """Hidden parts: landed as they are by every point (``LOOKUP`` first)."""
        self.verdict: Verdict | None = None
        """The NaN/inf vote of the hidden sync, waited for before it lands."""
        self.hidden_wait = 0.0
        """Seconds the last hidden sync waited when it landed; reported by the next sync."""
        self.hidden_exposed = 0.0
        """Build and start time of the hidden sync in flight (the engine's cost models)."""

    def start(self, part: Part, transfer: Transfer, plan: SyncPlan) -> Started:
        """The state machine of one started part: landing it marks its rows synced (unless
        ``place`` did at the start) and scales the accumulators it carried."""
        weights, states = part.weights, part.states
        marked = part.background or plan.hide

        def landed() -> None:
            if not marked:
                self.engine.synced(weights=weights, states=states)
                if self.scaler is not None and self.channel.size is not None:
                    self.scaler.factor = float(self.channel.size)  # c = the replicas averaged
            if states and self.scaler is not None:
                self.scaler.apply()

        return Started(transfer, landed, self._dropped)

    def place(self, part: Part, started: Started, plan: SyncPlan) -> None:
        """Keep a started part where the plan says, or hand it to the channel."""
        if part.background:  # tracking restarts now: updates from here on are the next delta
            self.engine.synced(weights=part.weights, states=part.states)
            self.background.append(started)
        elif plan.hide:  # lands as is before the next lookup: exact
            self.engine.synced(weights=part.weights, states=part.states)
            self.hidden.append(started)
        else:  # a plain channel lands it now, a holding one when it releases it
            self.channel.hand(started)

    def hand(self, write: Callable[[], None]) -> None:
        """A part whose collectives already ran (the MC identity merge): to the channel."""
        self.channel.hand(Started(WriteBack(write)))

    def observe(self, built: float) -> None:
        """The sync started at ``built`` is placed: its exposed time so far goes to the
        engine now, or, hidden, with its landing wait."""
        if self.hidden:
            self.hidden_exposed = time.perf_counter() - built
        else:
            self.engine.observe(time.perf_counter() - built)

    def take_hidden_wait(self) -> float:
        """The last hidden sync's landing wait, counted once by the sync that follows it."""
        waited, self.hidden_wait = self.hidden_wait, 0.0
        return waited

    def await_vote(self, verdict: Verdict | None, plan: SyncPlan, started: list[Started]) -> None:
        """The averages are in copies only: keep them only if the job is finite. A hidden
        sync's vote runs in the background too; its landing waits for it."""
        if verdict is None:
            return
        if plan.hide:
            self.verdict = verdict
            return
        try:
            verdict.wait()
        except SyncError:
            self.abandon(started)
            raise

    def land(self, point: LandingPoint) -> float:
        """Land what ``point`` lands (``LandingPoint``); return seconds spent waiting.

        Every point but ``LOOKUP`` first lets the channel settle what it holds (its holder
        decides: release or drop), then lands the hidden and background parts."""
        if point is LandingPoint.RELEASE or point is LandingPoint.SYNC:
            raise RuntimeError(f"{point.value} lands a part through its channel, not the policy")
        if point is not LandingPoint.LOOKUP:
            self.channel.settle()
        waited = self._land_hidden(point)
        if point is LandingPoint.LOOKUP:
            return waited
        background, self.background = self.background, []
        for started in background:
            waited += started.land(point)
        return waited

    def _land_hidden(self, point: LandingPoint) -> float:
        """Hidden parts: wait for their vote and average, write back (exact)."""
        if not self.hidden:
            return 0.0
        begin = time.perf_counter()
        waited = 0.0
        hidden, self.hidden = self.hidden, []
        verdict, self.verdict = self.verdict, None
        if verdict is not None:
            try:
                verdict.wait()
            except SyncError:
                self.abandon(hidden)
                raise
        for started in hidden:
            waited += started.land(point)
        self.hidden_wait += waited
        self.engine.observe(self.hidden_exposed + time.perf_counter() - begin)
        return waited

    def abandon(self, started: list[Started]) -> None:
        """Drop parts the NaN/inf vote refused (every replica drops them alike)."""
        for part in started:
            part.drop()

    def _dropped(self, held: bool) -> None:
        if held:  # replicas whose holder released it hold other values in its rows
            self.engine.diverged()
