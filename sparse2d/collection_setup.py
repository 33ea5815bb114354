"""What a ``DMPCollection`` call asks for, resolved and validated before any collective.

Step 1 of the construction (``sparse2d.collection``): pure and identical on every rank, so
a bad argument raises the same error everywhere before the first collective (the advisor
for ``sharding_group_size="auto"`` is the exception: it decides on rank 0 and broadcasts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torchrec.distributed.types import ModuleSharder

from sparse2d import validation
from sparse2d.advisor.auto import AUTO, auto_group_size
from sparse2d.compat import (
    CollectionArgs,
    adapt_all_reduce,
    check_world_size,
    note_ignored,
    parse_call,
    resolve_layout,
    resolve_strategy,
)
from sparse2d.contexts import ShardingContext, describe_contexts
from sparse2d.errors import ConfigError
from sparse2d.mesh import validate_group_size, validate_layout
from sparse2d.option_conflicts import check_collection
from sparse2d.planner import default_sharders
from sparse2d.planner.plan_store import as_plan_store
from sparse2d.sync.mc.tables import check_managed_collision
from sparse2d.sync.options import SyncOptions
from sparse2d.sync.transport.collectives import AllReduceHook


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
    """The model has managed-collision tables (``sparse2d.sync.mc``)."""


def resolve_setup(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Setup:
    """Parse either call form and check every argument against the model and the world."""
    call = parse_call(args, kwargs)
    device = validation.resolve_device(call.device)
    world_size, rank = validation.check_process_group(call.global_pg)
    check_world_size(call.world_size, world_size)
    pg = call.global_pg if call.global_pg is not None else dist.group.WORLD
    layout = resolve_layout(call.replica_layout, call.use_inter_host_allreduce)
    group_size = _group_size(call, module, world_size, device, pg, layout)
    validate_layout(layout)
    strategy = resolve_strategy(call.sharding_strategy)
    hook = adapt_all_reduce(call.custom_all_reduce)
    note_ignored(call)
    call.plan_store = as_plan_store(call.plan_store)
    sharders = list(call.sharders) if call.sharders is not None else default_sharders()
    validation.check_shardable(module, sharders)
    validation.check_optimizers(module, sharders, device)
    node_group_size = validation.resolve_node_group_size(
        call.node_group_size, group_size, world_size // group_size, layout
    )
    default = ShardingContext(
        module_type=None,
        paths=[],
        sharding_group_size=group_size,
        replica_layout=layout,
        node_group_size=node_group_size,
        strategy=strategy,
        plan=call.plan,
    )
    contexts = describe_contexts(module, world_size, default, call.submodule_configs, sharders)
    mc_tables = check_managed_collision(module)
    for ctx in contexts:  # the option-conflict rules, per context's sharding strategy
        check_collection(
            call.sync_options or SyncOptions(), ctx.strategy.name, mc_tables, hook is not None
        )
    has_mc = bool(mc_tables)
    return Setup(call, device, world_size, rank, pg, hook, sharders, contexts, has_mc)


def _group_size(
    call: CollectionArgs,
    module: nn.Module,
    world_size: int,
    device: torch.device,
    pg: dist.ProcessGroup,
    layout: str,
) -> int:
    """``sharding_group_size`` checked against the world, or the advisor's choice for
    ``"auto"`` (rank 0 decides and broadcasts: the same ``L`` everywhere)."""
    group_size = call.sharding_group_size
    if group_size is None:
        raise ConfigError(
            "sharding_group_size is required: the ranks per sharding group, a divisor of "
            f"the world size {world_size}."
        )
    if group_size == AUTO:
        group_size = auto_group_size(
            module,
            world_size,
            device,
            pg,
            call.planner_batch_size,
            call.sync_options,
            layout,
            call.constraints,
        )
    validate_group_size(world_size, group_size)  # type: ignore[arg-type]
    return group_size  # type: ignore[return-value]
