"""Measured ``auto``: the cost model shortlists group sizes, a short trial on the real job decides.

Why: the advisor's model is fitted on one 2-core box; outside its fit set it has missed the
best ``L`` by 1.36-1.48x (``bench/RESULTS.md``). A few timed steps of each shortlisted ``L``
on the job's own model and first batches cost seconds; a wrong ``L`` costs a fraction of a
multi-day run. So the model ranks every divisor of the world and keeps the candidates within
``margin`` of its predicted best (at most ``candidates``); each is built, stepped
``warmup_steps + timed_steps`` times and closed; the least median step time of the slowest
rank wins (one small all-reduce MAX per candidate, so every rank picks the same ``L``). With
a sync every N steps the timed steps are whole periods (a median step would leave the syncs
out); candidates within ``retrial_margin`` of the fastest are measured again in reverse order
and keep their lower time, so neither a pass's transient load nor going first decides a tie.

The trial leaves no trace: torch (CPU and CUDA), numpy and Python RNG states are restored
after each candidate, every candidate is a fresh model from the caller's ``build`` (the
caller's module is never sharded by the trial), and each is closed before the next. A
candidate that raises (out of memory, a plan or config error) is skipped with a log line; when
all fail, :class:`TrialError` lists each candidate and why, on every rank. A failure on some
ranks only is agreed by the per-candidate all-reduce when it happens outside a collective; one
inside a collective of the candidate (a rank dying mid all-to-all) ends at the process
group's timeout, as any collective would.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import random
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from sparse2d.advisor.search import Advice
from sparse2d.advisor.trial_options import TrialOptions
from sparse2d.comm_device import flag_device
from sparse2d.errors import TrialError

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class TrialResult:
    """One candidate: the model's prediction and what the trial measured (or why it failed)."""

    sharding_group_size: int
    predicted_s: float
    measured_s: float | None = None
    error: str | None = None
    seconds: float = 0.0
    """This candidate's share of the trial: build, steps and close, on this rank."""
    passes_s: list[float | None] = field(default_factory=list)
    """Each pass's time (two for a near-tie re-measured); ``measured_s`` is the lowest."""

    def as_json(self) -> dict[str, Any]:
        return {
            "sharding_group_size": self.sharding_group_size,
            "predicted_step_s": self.predicted_s,
            "measured_step_s": self.measured_s,
            "passes_step_s": list(self.passes_s),
            "error": self.error,
            "seconds": self.seconds,
        }


@dataclass(slots=True)
class TrialReport:
    """What the trial chose and why: every candidate's predicted and measured step."""

    chosen: int
    model_pick: int
    results: list[TrialResult] = field(default_factory=list)
    seconds: float = 0.0
    options: TrialOptions = field(default_factory=TrialOptions)
    period: int = 1
    """The job's sync cadence: the trial timed whole periods of this many steps."""
    layouts: dict[int, str] = field(default_factory=dict)
    """The replica layout each candidate ``L`` was built in, where the caller chose one per
    ``L`` (``replica_layout: auto``); empty: every candidate in the caller's one layout."""
    method: str = "measured"
    """``"measured"``: ``chosen`` won the trial; ``"model"``: no trial ran, ``chosen`` is the
    cost model's pick (``why_model`` says why)."""
    why_model: str = ""

    def summary(self) -> str:
        """One line: what was measured (fastest first) and the model's pick, or why not."""
        if self.method != "measured":
            return f"model: L={self.model_pick}; not measured: {self.why_model}"
        timed = sorted(
            (r for r in self.results if r.measured_s is not None),
            key=lambda r: (r.measured_s, r.sharding_group_size),
        )
        steps = ", ".join(f"L={r.sharding_group_size} {r.measured_s * 1e3:.1f} ms" for r in timed)
        return f"measured: {steps} in {self.seconds:.1f} s | model: L={self.model_pick}"

    def table(self) -> str:
        lines = [
            f"auto sharding_group_size trial ({len(self.results)} candidates, "
            f"{self.options.warmup_steps}+{self.options.timed_for(self.period)} steps each, "
            f"{self.seconds:.1f} s):",
            f"{'L':>6} {'predicted':>11} {'measured':>11} {'trial':>8}  note",
        ]
        for r in self.results:
            measured = f"{r.measured_s * 1e3:9.2f}ms" if r.measured_s is not None else "-".rjust(11)
            remeasured = "re-measured" if len(r.passes_s) > 1 else ""
            note = f"failed: {r.error}" if r.error else remeasured
            if r.sharding_group_size == self.chosen:
                other = "" if self.chosen == self.model_pick else f" (model: L={self.model_pick})"
                note = ", ".join(filter(None, [remeasured, "<- chosen" + other]))
            layout = self.layouts.get(r.sharding_group_size)
            lines.append(
                f"{r.sharding_group_size:>6} {r.predicted_s * 1e3:9.2f}ms {measured} "
                f"{r.seconds:7.1f}s  {note}" + (f" [{layout}]" if layout else "")
            )
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        return {
            "chosen": self.chosen,
            "model_pick": self.model_pick,
            "trial_s": self.seconds,
            "warmup_steps": self.options.warmup_steps,
            "timed_steps": self.options.timed_for(self.period),
            "sync_period": self.period,
            "retrial_margin": self.options.retrial_margin,
            "candidates": [r.as_json() for r in self.results],
            "layouts": {str(k): v for k, v in self.layouts.items()},
            "method": self.method,
            "why_model": self.why_model,
        }


def shortlist(advice: Advice, options: TrialOptions) -> list[tuple[int, float]]:
    """``(L, predicted step s)`` of the fitting candidates within the margin, best first, at
    most ``options.candidates``; the model's pick is always first."""
    fitting = sorted(
        (c for c in advice.candidates if c.fits),
        key=lambda c: (c.step_s, -c.sharding_group_size),
    )
    if not fitting:
        return []
    limit = fitting[0].step_s * (1.0 + options.margin)
    kept = [c for c in fitting if c.step_s <= limit][: max(1, options.candidates)]
    return [(c.sharding_group_size, c.step_s) for c in kept]


@contextlib.contextmanager
def rng_preserved() -> Iterator[None]:
    """Restore torch (CPU, CUDA), numpy and Python RNG state on exit: a trial leaves no trace."""
    import numpy as np

    cpu, py, npy = torch.get_rng_state(), random.getstate(), np.random.get_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        random.setstate(py)
        np.random.set_state(npy)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def close_candidate(model: Any) -> None:
    """Land a hidden sync still in flight (every rank closes the same candidate), then free
    the candidate's groups."""
    finish = getattr(model, "finish_sync", None)
    try:
        if finish is not None:
            finish()
    finally:
        close = getattr(model, "close", None)
        if callable(close):
            close()


def step_time(times: Sequence[float], period: int = 1) -> float:
    """The median step of ``times``; with a sync every ``period`` steps, the median of whole
    periods divided by ``period``, so each number carries one sync (a plain median would
    drop the sync steps as outliers and favour the layouts that sync the most)."""
    if period <= 1:
        return statistics.median(times)
    windows = [sum(times[i : i + period]) for i in range(0, len(times) - period + 1, period)]
    return statistics.median(windows) / period


def measure_group_sizes(
    build: Callable[[int], Any],
    step: Callable[[Any, int], Any],
    candidates: Sequence[tuple[int, float]],
    options: TrialOptions | None = None,
    pg: dist.ProcessGroup | None = None,
    close: Callable[[Any], None] = close_candidate,
    model_pick: int | None = None,
    period: int = 1,
) -> TrialReport:
    """Measure each ``(L, predicted s)`` of ``candidates`` on the real job; every rank of ``pg``
    returns the same report (``chosen``: least step time of the slowest rank).

    ``build(L)`` returns a fresh model at ``L`` (build the module inside it: a
    ``DMPCollection`` shards the module it is given); ``step(model, i)`` runs training step
    ``i`` on the job's own batch ``i``; ``close(model)`` releases it (default
    ``model.close()``); ``period``: the job's sync cadence (``SyncOptions.every``). The
    candidates within ``options.retrial_margin`` of the fastest, and the first one measured
    (it paid the process's first build), are measured once more in reverse order and keep
    their lower time. Raises :class:`TrialError` on every rank when
    all fail.
    """
    options = options or TrialOptions()
    if not candidates:
        raise TrialError("auto: no sharding group size to measure (none fits memory).")
    begin = time.perf_counter()
    measure = functools.partial(_measure, build, step, options=options, pg=pg, close=close)
    results = [measure(L, predicted, period=period) for L, predicted in candidates]
    ok = [r for r in results if r.measured_s is not None]
    if not ok:
        listed = "; ".join(f"L={r.sharding_group_size}: {r.error}" for r in results)
        raise TrialError(f"auto: every sharding group size failed its trial: {listed}")
    fastest = min(r.measured_s for r in ok)  # type: ignore[type-var]
    limit = fastest * (1.0 + options.retrial_margin)
    # The first candidate measured alone paid the process's first build (cold caches, lazy
    # inits): auto_bench saw it 5x its own fixed-L step and lose by far (new_tw_dim64).
    again = [r for r in ok if r.measured_s <= limit or r is ok[0]]  # type: ignore[operator]
    if options.retrial_margin > 0 and len(again) > 1:
        for result in reversed(again):
            again = measure(result.sharding_group_size, result.predicted_s, period=period)
            result.seconds += again.seconds
            result.passes_s.append(again.measured_s)
            if again.measured_s is not None:
                result.measured_s = min(result.measured_s, again.measured_s)  # type: ignore[type-var]
    best = min(ok, key=lambda r: (r.measured_s, r.sharding_group_size))
    return TrialReport(
        chosen=best.sharding_group_size,
        model_pick=candidates[0][0] if model_pick is None else model_pick,
        results=results,
        seconds=time.perf_counter() - begin,
        options=options,
        period=period,
    )


def _measure(
    build: Callable[[int], Any],
    step: Callable[[Any, int], Any],
    group_size: int,
    predicted: float,
    options: TrialOptions,
    pg: dist.ProcessGroup | None,
    close: Callable[[Any], None],
    period: int,
) -> TrialResult:
    """One pass of one candidate (built, stepped and closed), agreed by every rank (the
    slowest rank's time); a candidate that raises is skipped, never the end of the job."""
    start = time.perf_counter()
    model, times, error = None, [], None
    try:
        with rng_preserved():
            model = build(group_size)
            for i in range(options.steps_for(period)):
                begin = time.perf_counter()
                step(model, i)
                if i >= options.warmup_steps:
                    times.append(time.perf_counter() - begin)
    except Exception as failure:
        error = f"{type(failure).__name__}: {failure}".replace("\n", " ")[:300]
    finally:
        if model is not None:
            with contextlib.suppress(Exception):
                close(model)
    failed, slowest = _agree(None if error else step_time(times, period), pg)
    if failed and error is None:
        error = "failed on another rank"
    if error is not None:
        logger.warning("[sparse2d] auto trial: L=%d skipped (%s)", group_size, error)
    kept = None if failed else slowest
    return TrialResult(
        group_size, predicted, kept, error, time.perf_counter() - start, passes_s=[kept]
    )


def _agree(measured: float | None, pg: dist.ProcessGroup | None) -> tuple[bool, float]:
    """(failed on any rank, the slowest rank's median) by one all-reduce MAX."""
    values = torch.tensor([1.0 if measured is None else 0.0, measured or 0.0], dtype=torch.float64)
    if dist.is_initialized():
        values = values.to(flag_device(pg))
        dist.all_reduce(values, op=dist.ReduceOp.MAX, group=pg)
    return bool(values[0].item()), float(values[1].item())
