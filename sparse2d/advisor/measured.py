"""``measured_group_size``: the library's measured ``auto`` for callers who can give a step.

Apart from ``sparse2d.advisor.trial`` (the trial machinery, which builds nothing itself) because
it builds core ``DMPCollection``s, as ``sparse2d.advisor.embedding_trial`` (the constructor's
``"auto"``) does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from sparse2d.advisor.auto_pick import auto_candidates, workload_from_module
from sparse2d.advisor.trial import TrialReport, measure_group_sizes, rng_preserved
from sparse2d.advisor.trial_options import TrialOptions
from sparse2d.advisor.workload import Workload
from sparse2d.core.collection import DMPCollection


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
    options = options or TrialOptions()
    resolved = torch.device(device)
    pg = global_pg if global_pg is not None else dist.group.WORLD
    world = dist.get_world_size(pg)

    def workload() -> Workload:
        with rng_preserved():
            return workload_from_module(
                make_module(),
                batch_size_per_rank,
                dmp_kwargs.get("sync_options"),
                dmp_kwargs.get("replica_layout") or "intra_host",
                dmp_kwargs.get("constraints"),
            )

    pick, candidates = auto_candidates(workload, world, resolved, pg, options)
    sync_options = dmp_kwargs.get("sync_options")
    period = sync_options.every if sync_options is not None else 1
    if options.candidates == 0:
        report = TrialReport(chosen=pick, model_pick=pick, options=options, period=period)
        report.method, report.why_model = "model", "options.candidates=0"
        return report
    return measure_group_sizes(
        lambda L: DMPCollection(
            make_module(),
            L,
            device=resolved,
            global_pg=global_pg,
            planner_batch_size=batch_size_per_rank,
            **dmp_kwargs,
        ),
        step,
        candidates,
        options,
        pg=pg,
        model_pick=pick,
        period=period,
    )
