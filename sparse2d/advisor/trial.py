"""Measured ``auto``: the cost model shortlists group sizes, a short trial on the real job decides.

Why: the advisor's model is fitted on one 2-core box; outside its fit set it has missed the
best ``L`` by 1.36-1.48x (``bench/RESULTS.md``). A few timed steps of each shortlisted ``L``
on the job's own model and first batches cost seconds; a wrong ``L`` costs a fraction of a
multi-day run. So the model ranks every divisor of the world and keeps the candidates within
``margin`` of its predicted best (at most ``candidates``); each is built, stepped
``warmup_steps + timed_steps`` times and closed; the least median step time of the slowest
rank wins (one small all-reduce MAX per candidate, so every rank picks the same ``L``).

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
from sparse2d.errors import NoFitError, TrialError

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

    def as_json(self) -> dict[str, Any]:
        return {
            "sharding_group_size": self.sharding_group_size,
            "predicted_step_s": self.predicted_s,
            "measured_step_s": self.measured_s,
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

    def table(self) -> str:
        lines = [
            f"auto sharding_group_size trial ({len(self.results)} candidates, "
            f"{self.options.warmup_steps}+{self.options.timed_steps} steps each, "
            f"{self.seconds:.1f} s):",
            f"{'L':>6} {'predicted':>11} {'measured':>11} {'trial':>8}  note",
        ]
        for r in self.results:
            measured = f"{r.measured_s * 1e3:9.2f}ms" if r.measured_s is not None else "-".rjust(11)
            note = f"failed: {r.error}" if r.error else ""
            if r.sharding_group_size == self.chosen:
                other = "" if self.chosen == self.model_pick else f" (model: L={self.model_pick})"
                note = "<- chosen" + other
            lines.append(
                f"{r.sharding_group_size:>6} {r.predicted_s * 1e3:9.2f}ms {measured} "
                f"{r.seconds:7.1f}s  {note}"
            )
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        return {
            "chosen": self.chosen,
            "model_pick": self.model_pick,
            "trial_s": self.seconds,
            "warmup_steps": self.options.warmup_steps,
            "timed_steps": self.options.timed_steps,
            "candidates": [r.as_json() for r in self.results],
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


def _close(model: Any) -> None:
    close = getattr(model, "close", None)
    if callable(close):
        close()


def _one(
    build: Callable[[int], Any],
    step: Callable[[Any, int], Any],
    group_size: int,
    options: TrialOptions,
    close: Callable[[Any], None],
) -> tuple[float | None, str | None]:
    """Build, step and close one candidate; (median step s, None) or (None, why it failed)."""
    model = None
    times: list[float] = []
    try:
        with rng_preserved():
            model = build(group_size)
            for i in range(options.steps):
                start = time.perf_counter()
                step(model, i)
                if i >= options.warmup_steps:
                    times.append(time.perf_counter() - start)
    except Exception as error:  # skipped, never the end of the job
        why = f"{type(error).__name__}: {error}".replace("\n", " ")
        return None, why[:300]
    finally:
        if model is not None:
            with contextlib.suppress(Exception):
                close(model)
    return statistics.median(times), None


def measure_group_sizes(
    build: Callable[[int], Any],
    step: Callable[[Any, int], Any],
    candidates: Sequence[tuple[int, float]],
    options: TrialOptions | None = None,
    pg: dist.ProcessGroup | None = None,
    close: Callable[[Any], None] = _close,
    model_pick: int | None = None,
) -> TrialReport:
    """Measure each ``(L, predicted s)`` of ``candidates`` on the real job; every rank of ``pg``
    returns the same report (``chosen``: least median step of the slowest rank).

    ``build(L)`` returns a fresh model at ``L`` (build the module inside it: a
    ``DMPCollection`` shards the module it is given); ``step(model, i)`` runs training step
    ``i`` on the job's own batch ``i``; ``close(model)`` releases it (default
    ``model.close()``). Raises :class:`TrialError` on every rank when all fail.
    """
    options = options or TrialOptions()
    if not candidates:
        raise TrialError("auto: no sharding group size to measure (none fits memory).")
    begin = time.perf_counter()
    results = []
    for group_size, predicted in candidates:
        start = time.perf_counter()
        measured, error = _one(build, step, group_size, options, close)
        failed, slowest = _agree(measured, pg)
        if failed and error is None:
            error = "failed on another rank"
        result = TrialResult(
            group_size, predicted, None if failed else slowest, error, time.perf_counter() - start
        )
        if error is not None:
            logger.warning("[sparse2d] auto trial: L=%d skipped (%s)", group_size, error)
        results.append(result)
    ok = [r for r in results if r.measured_s is not None]
    if not ok:
        listed = "; ".join(f"L={r.sharding_group_size}: {r.error}" for r in results)
        raise TrialError(f"auto: every sharding group size failed its trial: {listed}")
    best = min(ok, key=lambda r: (r.measured_s, r.sharding_group_size))
    return TrialReport(
        chosen=best.sharding_group_size,
        model_pick=candidates[0][0] if model_pick is None else model_pick,
        results=results,
        seconds=time.perf_counter() - begin,
        options=options,
    )


def _agree(measured: float | None, pg: dist.ProcessGroup | None) -> tuple[bool, float]:
    """(failed on any rank, the slowest rank's median) by one all-reduce MAX."""
    values = torch.tensor([1.0 if measured is None else 0.0, measured or 0.0], dtype=torch.float64)
    if dist.is_initialized():
        if dist.get_backend(pg) == "nccl":  # nccl reduces device tensors only
            values = values.to(torch.device("cuda", torch.cuda.current_device()))
        dist.all_reduce(values, op=dist.ReduceOp.MAX, group=pg)
    return bool(values[0].item()), float(values[1].item())


def measured_group_size(
    make_module: Callable[[], Any],
    step: Callable[[Any, int], Any],
    *,
    device: torch.device | str = "cpu",
    batch_size_per_rank: int | None = None,
    options: TrialOptions | None = None,
    global_pg: dist.ProcessGroup | None = None,
    **dmp_kwargs: Any,
) -> TrialReport:
    """The library's measured ``auto``: advise on ``make_module()`` (rank 0, broadcast),
    shortlist, and measure each ``L`` as ``DMPCollection(make_module(), L, device=...,
    **dmp_kwargs)`` stepped by ``step(model, i)`` on the job's batch ``i``; then build the
    real model with ``report.chosen``. ``make_module`` must return a fresh module each call
    (sharding consumes it; seed inside it for the same initial weights). With
    ``options.candidates == 0`` no trial runs (``report.results`` is empty)."""
    from sparse2d.advisor.auto import share_from_rank0, topology_for_device, workload_from_module
    from sparse2d.advisor.search import advise, no_fit_message
    from sparse2d.collection import DMPCollection

    options = options or TrialOptions()
    resolved = torch.device(device)
    pg = global_pg if global_pg is not None else dist.group.WORLD
    world = dist.get_world_size(pg)

    def rank_candidates() -> tuple[int, list[tuple[int, float]]]:
        with rng_preserved():
            workload = workload_from_module(
                make_module(), batch_size_per_rank, dmp_kwargs.get("sync_options"),
                dmp_kwargs.get("replica_layout") or "intra_host", dmp_kwargs.get("constraints"),
            )  # fmt: skip
        topology = topology_for_device(resolved, world)
        advice = advise(workload, topology)
        if advice.recommended is None:
            raise NoFitError(no_fit_message(advice, workload, topology))
        return advice.recommended, shortlist(advice, options)

    pick, candidates = share_from_rank0(rank_candidates, pg)
    if options.candidates == 0:
        return TrialReport(chosen=pick, model_pick=pick, options=options)
    return measure_group_sizes(
        lambda L: DMPCollection(
            make_module(),
            L,
            device=resolved,
            global_pg=global_pg,
            planner_batch_size=batch_size_per_rank,
            **dmp_kwargs,
        ),  # fmt: skip
        step,
        candidates,
        options,
        pg=pg,
        model_pick=pick,
    )
