"""Which mode the next sync of ``engine="auto"`` runs: the decision alone.

No tensors and no collectives: fed the same agreed numbers, every replica chooses the same.
Per mode a ``CostFit`` learns measured seconds as ``fixed + slope x modelled`` (the probe
prices bytes well but fixed costs badly; one measured/modelled ratio was off by 50x at another
union size). ``home`` switches when the other mode is predicted ``HYSTERESIS`` cheaper; the
other mode is explored after ``EXPLORE_FIRST`` home syncs, then at doubling intervals up to
``EXPLORE_LAST``, only while predicted within ``EXPLORE_RATIO`` of home. A mode never
measured borrows the other's fit.
"""

from __future__ import annotations

from dataclasses import dataclass

DENSE, SPARSE = "dense", "sparse"
HYSTERESIS = 0.9
"""Switch home only when the other mode is predicted below this fraction of it."""
FORGET = 0.3
"""Weight of the newest measurement in a fit (older ones decay by 1 - FORGET each)."""
SLOPE_RANGE = (0.2, 20.0)
"""Bounds of a fitted slope (noise in a few points must not swamp the model)."""
EXPLORE_FIRST, EXPLORE_LAST = 4, 256
"""Home syncs before the first exploration of the other mode, and the longest interval."""
EXPLORE_RATIO = 2.0
"""The other mode is tried only while predicted below this multiple of home."""


@dataclass(slots=True)
class CostFit:
    """Measured seconds of one mode as ``fixed + slope x modelled`` (exponentially weighted
    least squares, fixed >= 0). Slope 1 (the probe's bytes are right, the fixed cost is
    learnt) until the modelled seconds have varied by more than 10% around their mean."""

    weight: float = 0.0
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0

    def add(self, modelled: float, measured: float) -> None:
        keep = 1.0 - FORGET
        self.weight = keep * self.weight + 1.0
        self.x = keep * self.x + modelled
        self.y = keep * self.y + measured
        self.xx = keep * self.xx + modelled * modelled
        self.xy = keep * self.xy + modelled * measured

    def slope(self) -> float:
        """1, or the fitted slope once the modelled seconds varied; never so steep that the
        fixed part turns negative (a model that over-prices everything is scaled down)."""
        mean_x, mean_y = self.x / self.weight, self.y / self.weight
        spread = self.xx / self.weight - mean_x * mean_x
        slope = 1.0
        if spread > (0.1 * mean_x) ** 2:
            covariance = self.xy / self.weight - mean_x * mean_y
            slope = min(SLOPE_RANGE[1], max(SLOPE_RANGE[0], covariance / spread))
        return min(slope, mean_y / mean_x) if mean_x > 0 else slope

    def predict(self, modelled: float) -> float:
        mean_x, mean_y = self.x / self.weight, self.y / self.weight
        return max(0.0, mean_y + self.slope() * (modelled - mean_x))

    def borrowed(self, modelled: float) -> float:
        """Another mode's seconds, optimistically: the lower of this mode's measured/modelled
        ratio and its excess in seconds applied to ``modelled``."""
        mean_x, mean_y = self.x / self.weight, self.y / self.weight
        ratio = mean_y / mean_x if mean_x > 0 else 1.0
        return max(0.0, min(modelled * ratio, modelled + mean_y - mean_x))


class ModeChooser:
    """Fed each sync's modelled seconds per mode (``choose``) and, later, the agreed measured
    seconds of a past sync (``refine``)."""

    def __init__(self) -> None:
        self.home = SPARSE
        """The mode syncs run in unless exploring (switched by predictions)."""
        self.fits: dict[str, CostFit | None] = {DENSE: None, SPARSE: None}
        """Per mode, its measured seconds as a function of modelled ones; None = never measured."""
        self.explored = 0
        """Syncs that ran the other mode to measure it."""
        self._home_syncs = 0  # home syncs since the last exploration (or switch)
        self._interval = EXPLORE_FIRST
        self._awaiting = False  # an exploration's measurement has not landed yet
        self._estimate: dict[str, float] = {}  # the last choice's predictions

    def estimate(self, cost: dict[str, float]) -> dict[str, float]:
        """Predicted seconds per mode from modelled ``cost``."""
        out = {}
        for mode, modelled in cost.items():
            other = DENSE if mode == SPARSE else SPARSE
            own, theirs = self.fits[mode], self.fits[other]
            if own is not None:
                out[mode] = own.predict(modelled)
            elif theirs is not None:
                out[mode] = theirs.borrowed(modelled)
            else:
                out[mode] = modelled
        return out

    def choose(self, cost: dict[str, float]) -> str:
        """The mode of the next sync; updates ``home`` and the exploration schedule."""
        est = self._estimate = self.estimate(cost)
        measured = {m for m, fit in self.fits.items() if fit is not None}
        if not measured:  # nothing measured yet: the model alone
            self.home = min(est, key=est.__getitem__)
            return self.home
        other = DENSE if self.home == SPARSE else SPARSE
        if self.home not in measured or (
            other in measured and est[other] < HYSTERESIS * est[self.home]
        ):
            self.home, self._home_syncs, self._interval = other, 0, EXPLORE_FIRST
            return self.home
        self._home_syncs += 1
        if other in measured:
            due = self._home_syncs > self._interval
        else:  # as soon as home is measured; again if the measurement got lost
            due = not self._awaiting or self._home_syncs > EXPLORE_FIRST
        if due and est[other] < EXPLORE_RATIO * est[self.home]:
            if other in measured:
                self._interval = min(EXPLORE_LAST, 2 * self._interval)
            self._home_syncs, self._awaiting = 0, True
            self.explored += 1
            return other
        return self.home

    def settled(self) -> bool:
        """The next ``choose``, fed the costs it was fed last, returns ``home`` again (no
        exploration due; costs change only when a measurement lands)."""
        est = self._estimate
        measured = {m for m, fit in self.fits.items() if fit is not None}
        if not est or not measured:
            return bool(est)  # the model alone: the same costs, the same choice
        other = DENSE if self.home == SPARSE else SPARSE
        if self.home not in measured:
            return False
        if other in measured:
            due = self._home_syncs + 1 > self._interval
        else:
            due = not self._awaiting or self._home_syncs + 1 > EXPLORE_FIRST
        return not (due and est[other] < EXPLORE_RATIO * est[self.home])

    def refine(self, mode: str, modelled_s: float, measured_s: float) -> None:
        """Fold the agreed measured time of a past ``mode`` sync (modelled ``modelled_s``) in.

        An explored mode's rare measurement starts its fit afresh: what it learnt before may
        be many syncs stale (the workload may have changed since).
        """
        if measured_s <= 0 or modelled_s <= 0:
            return
        self._awaiting = self._awaiting and mode == self.home
        fit = self.fits[mode]
        if fit is None or mode != self.home:
            fit = self.fits[mode] = CostFit()
        fit.add(modelled_s, measured_s)
