"""What the measured ``auto`` is told (``TrialOptions``), apart from the trial machinery so
configs can read and check it without importing torch (as ``sparse2d.sync.options``)."""

from __future__ import annotations

from dataclasses import dataclass

from sparse2d.errors import KeyValueError

RANGES: dict[str, tuple[float, float]] = {
    "candidates": (0, 64),
    "margin": (0.0, 100.0),
    "warmup_steps": (0, 1000),
    "timed_steps": (1, 1000),
    "retrial_margin": (0.0, 100.0),
}
"""Accepted values of each :class:`TrialOptions` field (inclusive)."""


def out_of_range(key: str, value: object) -> str | None:
    """Why ``value`` is refused for ``key`` (None: accepted)."""
    low, high = RANGES[key]
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    real = key in ("margin", "retrial_margin")
    if not real and not isinstance(value, int):
        number = False
    if number and low <= value <= high:  # type: ignore[operator]
        return None
    kind = "a number" if real else "an integer"
    return f"must be {kind} in [{low:g}, {high:g}]"


@dataclass(frozen=True, slots=True)
class TrialOptions:
    """How much the measured ``auto`` may spend (defaults: <= 10% of a 1000-step main job).
    Bad values raise ``KeyValueError`` naming the field (the trainer's loader prefixes
    ``parallel.auto.``)."""

    candidates: int = 3
    """Most shortlisted ``L`` to measure (k); 0 keeps the model-only pick (no trial)."""
    margin: float = 0.5
    """Shortlist the ``L`` whose predicted step is within ``(1 + margin)`` x the predicted best
    (0.5: the model's out-of-sample misses reached 1.48x)."""
    warmup_steps: int = 2
    """Untimed steps per candidate (first-step allocations, the sync engine's start-up)."""
    timed_steps: int = 5
    """Timed steps per candidate; the median is its step time. With a sync every N > 1 steps
    the trial times whole sync periods instead (this many steps rounded up to a multiple of N,
    the median period / N), so the sync's cost is in every candidate's number."""
    retrial_margin: float = 0.15
    """Candidates measured within ``(1 + retrial_margin)`` x the fastest, and the first
    candidate (which paid the process's first build), are measured again in reverse order
    and keep the lower of their two times: a near-tie is not decided by one pass's transient
    load, nor a candidate lost by being measured first (0: one pass)."""

    def __post_init__(self) -> None:
        for key in RANGES:
            why = out_of_range(key, getattr(self, key))
            if why is not None:
                raise KeyValueError(key, f"={getattr(self, key)!r} {why}.")

    def timed_for(self, period: int) -> int:
        """Timed steps with a sync every ``period`` steps: whole periods, at least ``timed_steps``."""
        return -(-self.timed_steps // period) * period

    def steps_for(self, period: int) -> int:
        """Steps one candidate runs (warm-up, then whole sync periods timed)."""
        return self.warmup_steps + self.timed_for(period)
