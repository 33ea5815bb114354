"""The plan of one replica sync, decided before anything is built or sent.

A sync sends one payload, or two when weights and optimizer state travel differently
(delayed state). Each payload either goes to the channel (which lands it now, or holds it),
lands in the background (delayed state: the next sync lands it with delta correction) or
before the next lookup (hide); ``sync.landing`` lists the points. ``plan_sync`` makes that
choice from the options of the call alone, so every rank makes the same one; ``Opening`` is
what the sync found when it began, and makes its ``SyncReport``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sparse2d.sync.options import SyncReport


@dataclass(frozen=True, slots=True)
class Part:
    """One payload of a sync."""

    key: str
    """``"all"`` (weights and state in one payload), ``"weights"`` or ``"states"``."""
    weights: bool
    states: bool
    background: bool
    """Averaged while training goes on; a later sync lands it (delayed state)."""


@dataclass(frozen=True, slots=True)
class SyncPlan:
    parts: list[Part]
    in_place: bool
    """Payloads may be live views averaged in place: no transfer overlaps training, and the
    channel holds no average."""
    hide: bool
    """Land before the next lookup (``LandingPoint.LOOKUP``) instead of now; never with a
    background part."""

    @property
    def background(self) -> bool:
        return any(part.background for part in self.parts)


def plan_sync(*, states: bool, async_states: bool, hide: bool, copies: bool) -> SyncPlan:
    """The payloads of one sync and where each lands. The weights always land at this sync
    (or before the next lookup, hidden); ``async_states``: the optimizer state lands at the
    next sync (delayed state).

    ``copies``: payloads must stay private copies whatever the timing (a channel that
    ``holds`` keeps the average until it releases it).
    """
    if states and not async_states:
        # One payload for both kinds: one collective per dtype, as few copies as possible.
        parts = [Part("all", True, True, False)]
    else:
        parts = [Part("weights", True, False, False)]
        parts += [Part("states", False, True, True)] if states else []
    background = any(part.background for part in parts)
    return SyncPlan(parts, in_place=not copies and not background, hide=hide and not background)


@dataclass(slots=True)
class Opening:
    """What a sync (or a fold) found when it began."""

    step: int
    waited: float
    """Seconds this sync waited for transfers of earlier syncs still in flight."""
    landed: float
    """Seconds the last hidden sync waited when it landed (``LandingPoint.LOOKUP``): counted
    with the sync that follows it."""
    divergence: float | None
    """Relative distance to the replica mean, when due (``SyncOptions.divergence_every``)."""
    began: float = field(default_factory=time.perf_counter)

    def report(self, moved: int) -> SyncReport:
        """The report of the sync that began here and sent ``moved`` bytes."""
        return SyncReport(
            step=self.step,
            bytes=moved,
            seconds=time.perf_counter() - self.began + self.landed,
            divergence=self.divergence,
            wait_seconds=self.waited + self.landed,
        )
