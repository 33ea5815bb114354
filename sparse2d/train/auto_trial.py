"""The trainer's measured ``sharding_group_size: auto`` (``parallel.auto``).

The advisor ranks every divisor of the world on the config's workload (rank 0, broadcast);
``sparse2d.advisor.trial`` builds each shortlisted ``L`` exactly as the trainer would (same
``model.init_seed``, same factory, a fresh dense optimizer), runs ``warmup + timed`` steps
of the job's own first batches through the job's own step (plain or pipelined), and closes
it. RNG is restored after each candidate and data is positional (``DataSource.train(step)``),
so training then starts at the chosen ``L`` from the state an explicit ``L`` would give.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from sparse2d.advisor.auto_pick import topology_for_device
from sparse2d.advisor.search import advise, no_fit_message
from sparse2d.advisor.trial import TrialReport, close_candidate, measure_group_sizes, shortlist
from sparse2d.comm_device import share_from_rank0
from sparse2d.errors import NoFitError
from sparse2d.train.advisor_workload import workload_from_config
from sparse2d.train.config import Config

Build = Callable[[int, str], tuple[Any, torch.optim.Optimizer]]
"""(``L``, replica layout) -> (a fresh sharded model, its dense optimizer), built as the
trainer builds them."""


def resolve_group_size(
    cfg: Config, device: torch.device, world: int, build: Build
) -> tuple[int, str, TrialReport | None]:
    """``L`` and the replica layout for this job and, for a measured ``auto``, the trial's
    report. ``replica_layout: auto`` takes the advisor's layout for each ``L`` (the faster of
    the two on the job's topology: ``SPARSE2D_TOPOLOGY`` where a launcher describes the
    cluster); the trial measures each shortlisted ``L`` in that layout."""
    size, layout = cfg.group_size(world), cfg.parallel.replica_layout
    if size != "auto" and layout != "auto":
        return int(size), layout, None
    options = cfg.parallel.auto

    def rank_candidates() -> tuple[int, list[tuple[int, float]], dict[int, str]]:
        workload = workload_from_config(cfg)
        topology = topology_for_device(device, world)
        advice = advise(workload, topology)
        layouts = {c.sharding_group_size: c.replica_layout for c in advice.candidates}
        if size != "auto":  # only the layout is asked for
            return int(size), [], layouts
        if advice.recommended is None:
            raise NoFitError(no_fit_message(advice, workload, topology))
        return advice.recommended, shortlist(advice, options), layouts

    model_pick, candidates, layouts = share_from_rank0(rank_candidates, dist.group.WORLD)
    if layout != "auto":
        layouts = dict.fromkeys(layouts, layout)
    if size != "auto" or options.candidates == 0:
        return model_pick, layouts[model_pick], None
    period = cfg.parallel.sync.every
    report = measure_group_sizes(
        lambda L: _candidate(cfg, device, build, L, layouts[L], options.steps_for(period)),
        lambda built, i: built[1].run(i, device, built[0].maybe_sync),
        candidates,
        options,
        close=_close,
        model_pick=model_pick,
        period=period,
    )
    report.layouts = {r.sharding_group_size: layouts[r.sharding_group_size] for r in report.results}
    return report.chosen, layouts[report.chosen], report


def _candidate(
    cfg: Config, device: torch.device, build: Build, group_size: int, layout: str, steps: int
) -> tuple[Any, Any]:
    """One candidate as the trainer builds it: model, dense optimizer, the job's step."""
    # here, not at the top: the data and the pipeline load TorchRec, and this module is
    # imported by sparse2d.train.model_builder, which the trainer's main imports before the config
    # is checked (see its docstring)
    from sparse2d.train.data import DataSource
    from sparse2d.train.pipeline import make_steps

    cache_dir = cfg.data.criteo.cache_dir or os.path.join(cfg.run_dir, "criteo_cache")
    data = DataSource(cfg, dist.get_rank(), dist.get_world_size(), cache_dir)
    model, optimizer = build(group_size, layout)
    try:
        steps_ = make_steps(cfg.train.pipeline, model, optimizer, data, device, 0, steps)
    except BaseException:
        model.close()
        raise
    return model, steps_


def _close(built: tuple[Any, Any]) -> None:
    close_candidate(built[0])  # the model; the dense optimizer needs no closing


def log_trial(model: Any, log: Any, is_main: bool) -> dict[str, Any]:
    """Write the trial's table (stdout) and record (``metrics.jsonl``, kind ``auto_trial``);
    return the summary's ``auto_trial`` entry (empty without a trial)."""
    report: TrialReport | None = getattr(model, "trial_report", None)
    if report is None:
        return {}
    if is_main:
        print(report.table(), flush=True)
    log({"kind": "auto_trial", **report.as_json()})
    return {"auto_trial": report.as_json()}
