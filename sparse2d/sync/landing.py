"""Where a sync's started averages wait, and how they land.

A part of a sync (``sync.plan``) lands now, or waits here: in the background (delayed
state: the next sync lands it with delta correction), hidden (landed exactly before
the next lookup, after its NaN/inf vote), or uncommitted (a deferred channel: written back
by the step's commit, dropped by a failed one). Landing a part tells the engine the rows are
in sync again and scales the AdaGrad accumulators when it carried optimizer state.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from sparse2d.errors import SyncError

if TYPE_CHECKING:
    from sparse2d.sync.engines.base import SyncEngine
    from sparse2d.sync.guard import Verdict
    from sparse2d.sync.plan import Part, SyncPlan
    from sparse2d.sync.transport.transfer import Pending
    from sparse2d.sync.variants.scaling import AccumulatorScaler


class Landing:
    """The started, not yet landed averages of one sync policy."""

    def __init__(
        self,
        engine: SyncEngine,
        scaler: AccumulatorScaler | None,
    ) -> None:
        self.engine = engine
        self.scaler = scaler
        self.background: list[Pending] = []
        """Delayed parts: the next sync (``finish``) lands them."""
        self.hidden: list[Pending] = []
        """Hidden parts: landed as they are before the next lookup (``land``)."""
        self.verdict: Verdict | None = None
        """The NaN/inf vote of the hidden sync, waited for in ``land``."""
        self.uncommitted: list[tuple[Pending, bool, bool]] = []  # (transfer, weights, states)
        self.hidden_wait = 0.0
        """Seconds the last hidden sync waited when it landed; reported by the next sync."""
        self.hidden_exposed = 0.0
        """Build and start time of the hidden sync in flight (the engine's cost models)."""

    def place(self, part: Part, pending: Pending, plan: SyncPlan, deferred: bool) -> None:
        """Land one started part now, or keep it where the plan (or the channel) says."""
        weights, states = part.weights, part.states
        if part.background:  # tracking restarts now: updates from here on are the next delta
            self.engine.synced(weights=weights, states=states)
            self.background.append(pending)
        elif plan.hide:  # lands as is before the next lookup (``land``): exact
            self.engine.synced(weights=weights, states=states)
            self.hidden.append(pending)
        elif deferred:  # written back by ``commit`` once the step commits
            self.uncommitted.append((pending, weights, states))
        else:
            pending.complete()
            self.engine.synced(weights=weights, states=states)
            self._scale(states)

    def observe(self, built: float) -> None:
        """The sync started at ``built`` is placed: its exposed time so far goes to the
        engine now, or, hidden, with its landing wait (``land``)."""
        if self.hidden:
            self.hidden_exposed = time.perf_counter() - built
        else:
            self.engine.observe(time.perf_counter() - built)

    def take_hidden_wait(self) -> float:
        """The last hidden sync's landing wait, counted once by the sync that follows it."""
        waited, self.hidden_wait = self.hidden_wait, 0.0
        return waited

    def await_vote(self, verdict: Verdict | None, plan: SyncPlan, started: list[Pending]) -> None:
        """The averages are in copies only: keep them only if the job is finite. A hidden
        sync's vote runs in the background too; ``land`` waits for it."""
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

    def land(self) -> float:
        """Land hidden parts: wait for their vote and average, write back (exact)."""
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
        for transfer in hidden:
            waited += transfer.complete()
            self._scale(transfer.kind == "states")
        self.hidden_wait += waited
        self.engine.observe(self.hidden_exposed + time.perf_counter() - begin)
        return waited

    def finish(self) -> float:
        """Land every part still in flight; return seconds spent waiting."""
        waited = self.land()
        background, self.background = self.background, []
        for transfer in background:
            waited += transfer.complete()
            self._scale(transfer.kind == "states")
        return waited

    def commit(self) -> None:
        """The step committed: write the averages held in copies back into the shards."""
        pending, self.uncommitted = self.uncommitted, []
        for transfer, weights, states in pending:
            transfer.complete()
            self.engine.synced(weights=weights, states=states)
            self._scale(states)

    def discard(self) -> None:
        """The step failed its commit: drop the averages, every shard keeps its own values."""
        pending, self.uncommitted = self.uncommitted, []
        self.abandon([transfer for transfer, _, _ in pending])
        if pending:  # groups that committed it hold other values in its rows
            self.engine.diverged()

    def abandon(self, started: list[Pending]) -> None:
        """Drain refused transfers without writing back (the process groups stay usable)."""
        for pending in started:
            pending.reduction.wait()

    def _scale(self, states: bool) -> None:
        if states and self.scaler is not None:
            self.scaler.apply()
