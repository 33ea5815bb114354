"""What a ``DMPCollection`` call asks for, resolved and validated before any collective.

Step 1 of the construction (``sparse2d.core.collection``): pure and identical on every rank, so
a bad argument raises the same error everywhere before the first collective (the advisor
for ``sharding_group_size="auto"`` is the exception: it decides on rank 0 and broadcasts,
and once every argument is checked at its pick, the door's trial measures the shortlist,
``sparse2d.advisor.door_trial``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torchrec.distributed.types import ModuleSharder, ShardingPlan

from sparse2d import validation
from sparse2d.advisor.auto_pick import AUTO, DEFAULT_BATCH_SIZE, auto_candidates
from sparse2d.advisor.door_trial import DoorJob, door_group_size
from sparse2d.advisor.trial import TrialReport
from sparse2d.advisor.trial_options import TrialOptions
from sparse2d.core.call_forms import (
    CollectionArgs,
    adapt_custom_all_reduce,
    check_world_size,
    note_ignored,
    parse_call,
    resolve_layout,
    resolve_strategy,
)
from sparse2d.core.construction import ConstructionReport
from sparse2d.core.contexts import ShardingContext, build_contexts, describe_contexts
from sparse2d.errors import ConfigError
from sparse2d.managed_collision.tables import check_managed_collision
from sparse2d.mesh import validate_group_size, validate_layout
from sparse2d.option_conflicts import check_collection
from sparse2d.planner import default_sharders
from sparse2d.planner.plan_store import as_plan_store
from sparse2d.sync.collectives import AllReduceHook
from sparse2d.sync.options import SyncOptions


@dataclass(slots=True)
class Setup:
    """The resolved call: what the collective steps of the construction need."""

    call: CollectionArgs
    device: torch.device
    world_size: int
    rank: int
    pg: dist.ProcessGroup
    """``global_pg``, or the default group."""
    hook: AllReduceHook | None
    sharders: list[ModuleSharder[nn.Module]]
    contexts: list[ShardingContext]
    """The default context, then one per ``submodule_configs`` entry (not built yet)."""
    has_mc: bool
    """The model has managed-collision tables (``sparse2d.managed_collision``)."""
    trial_report: TrialReport | None = None
    """For ``sharding_group_size="auto"``: how ``L`` was chosen (measured or the model's)."""

    def plan(self, module: nn.Module, report: ConstructionReport) -> ShardingPlan:
        """Steps 2-3 of the construction, for the model and for a dry run alike: the mesh and
        plan of every context, remapped to this rank's groups (collective:
        ``build_contexts``)."""
        call = self.call
        return build_contexts(
            self.contexts,
            module,
            self.sharders,
            self.device,
            self.rank,
            self.pg,
            call.constraints,
            call.planner_batch_size,
            call.plan_store,
            report,
        )


def resolve_setup(
    module: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    collection: Callable[..., Any] | None = None,
) -> Setup:
    """Parse either call form and check every argument against the model and the world;
    for ``"auto"``, ``collection`` (``DMPCollection``) builds the door's trial candidates
    (``None``: no trial, the model's pick)."""
    call = parse_call(args, kwargs)
    options = _auto_options(call.auto_options, call.sharding_group_size)
    device = validation.resolve_device(call.device)
    world_size, rank = validation.check_process_group(call.global_pg)
    check_world_size(call.world_size, world_size)
    pg = call.global_pg if call.global_pg is not None else dist.group.WORLD
    layout = resolve_layout(call.replica_layout, call.use_inter_host_allreduce)
    group_size, shortlist = _group_size(call, module, world_size, device, pg, layout, options)
    validate_layout(layout)
    strategy = resolve_strategy(call.sharding_strategy)
    hook = adapt_custom_all_reduce(call.custom_all_reduce)
    note_ignored(call)
    call.plan_store = as_plan_store(call.plan_store)
    sharders = list(call.sharders) if call.sharders is not None else default_sharders()
    validation.check_shardable(module, sharders)
    validation.check_optimizers(module, sharders, device)

    def contexts_at(size: int) -> list[ShardingContext]:
        node_group_size = validation.resolve_node_group_size(
            call.node_group_size, size, world_size // size, layout
        )
        default = ShardingContext(
            module_type=None,
            paths=[],
            sharding_group_size=size,
            replica_layout=layout,
            node_group_size=node_group_size,
            strategy=strategy,
            plan=call.plan,
        )
        return describe_contexts(module, world_size, default, call.submodule_configs, sharders)

    contexts = contexts_at(group_size)
    mc_tables = check_managed_collision(module)
    for ctx in contexts:  # the option-conflict rules, per context's sharding strategy
        check_collection(
            call.sync_options or SyncOptions(), ctx.strategy.name, mc_tables, hook is not None
        )
    has_mc = bool(mc_tables)
    report = None
    if shortlist is not None:  # "auto": every argument checked at the model's pick
        batch = call.planner_batch_size or DEFAULT_BATCH_SIZE
        job = DoorJob(call, device, pg, layout, sharders, batch, has_mc, collection)
        report = door_group_size(module, job, group_size, shortlist, options)
        if report.chosen != group_size:
            contexts = contexts_at(report.chosen)
    return Setup(call, device, world_size, rank, pg, hook, sharders, contexts, has_mc, report)


def _auto_options(value: object, group_size: object = "auto") -> TrialOptions:
    """``auto_options``: how much the door's trial may spend (default ``TrialOptions()``).
    Given beside a fixed ``L`` it would do nothing, so it is refused rather than ignored."""
    if value is None:
        return TrialOptions()
    if group_size != "auto":
        raise ConfigError(
            f"auto_options={value!r} was given with sharding_group_size={group_size!r}; "
            "it only tunes the trial of sharding_group_size='auto'. Drop auto_options, or "
            "pass 'auto' to let the trial choose L."
        )
    if not isinstance(value, TrialOptions):
        raise ConfigError(
            f"auto_options={value!r} must be a sparse2d.TrialOptions (e.g. "
            "TrialOptions(candidates=0) to keep the model's pick without a trial)."
        )
    return value


def _group_size(
    call: CollectionArgs,
    module: nn.Module,
    world_size: int,
    device: torch.device,
    pg: dist.ProcessGroup,
    layout: str,
    options: TrialOptions,
) -> tuple[int, list[tuple[int, float]] | None]:
    """``sharding_group_size`` checked against the world, or for ``"auto"`` the advisor's
    pick and shortlist (rank 0 decides and broadcasts: the same everywhere)."""
    group_size = call.sharding_group_size
    if group_size is None:
        raise ConfigError(
            "sharding_group_size is required: the ranks per sharding group, a divisor of "
            f"the world size {world_size}."
        )
    shortlist = None
    if group_size == AUTO:
        group_size, shortlist = auto_candidates(
            module,
            world_size,
            device,
            pg,
            call.planner_batch_size,
            call.sync_options,
            layout,
            call.constraints,
            options,
        )
    validate_group_size(world_size, group_size)  # type: ignore[arg-type]
    return group_size, shortlist  # type: ignore[return-value]
