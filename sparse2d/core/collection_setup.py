"""Steps 1-4 of the construction (``sparse2d.core.collection``): validate, L and layout, plan, mesh.

Steps 1-2 are pure and identical on every rank, so a bad argument raises the same error everywhere
before the first collective. Step 1 checks every argument that does not depend on ``L``;
step 2 takes ``L`` (``fixed_group_size``: the call's ``int``; for ``"auto"`` the public
``sparse2d.DMPCollection`` asks the advisor instead, whose advice is a collective) and checks
what depends on it while describing each context's layout (``choose_layout``). Steps 3-4
(``Setup.plan``, ``Setup.mesh``) are the first collectives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torchrec.distributed.types import ModuleSharder, ShardingPlan, ShardingStrategy

from sparse2d import validation
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
from sparse2d.core.contexts import ShardingContext, describe_contexts, sharders_for
from sparse2d.core.fully_sharded.checks import check_fully_sharded_plan
from sparse2d.errors import ConfigError
from sparse2d.managed_collision.tables import check_managed_collision
from sparse2d.mesh import Mesh2D, build_mesh, validate_group_size, validate_layout
from sparse2d.option_conflicts import check_collection
from sparse2d.planner import default_sharders
from sparse2d.planner.group_plan import GroupPlan, plan_for_group
from sparse2d.planner.plan_store import as_plan_store
from sparse2d.sync.collectives import AllReduceHook
from sparse2d.sync.options import SyncOptions


@dataclass(slots=True)
class Setup:
    """The validated call: what the later steps of the construction need."""

    call: CollectionArgs
    device: torch.device
    world_size: int
    rank: int
    pg: dist.ProcessGroup
    """``global_pg``, or the default group."""
    sharding_group_size: int | str | None
    """As given: an ``int``, ``"auto"`` or ``None`` (checked in step 2)."""
    replica_layout: str
    strategy: ShardingStrategy
    hook: AllReduceHook | None
    sharders: list[ModuleSharder[nn.Module]]
    mc_tables: list[str]
    """The model's managed-collision tables (``sparse2d.managed_collision``)."""

    @property
    def has_mc(self) -> bool:
        return bool(self.mc_tables)

    def plan(
        self, module: nn.Module, contexts: list[ShardingContext], report: ConstructionReport
    ) -> None:
        """Step 3, for the model and a dry run alike: every context's plan for ranks
        ``0..L-1``. Collective: rank 0 plans for ``L`` ranks and all receive (under the fake
        backend of a dry run each rank plans alone), or the stored plan is loaded; a given
        plan is used as it is."""
        call = self.call
        plan_pg = None if dist.get_backend(self.pg) == "fake" else self.pg
        for ctx in contexts:
            if ctx.plan is None:
                with report.phase("plan"):
                    made = GroupPlan(ShardingPlan(plan={}))  # a context with no modules
                    if ctx.paths:
                        made = plan_for_group(
                            module,
                            ctx.sharding_group_size,
                            self.device.type,
                            sharders_for(ctx, contexts, self.sharders),
                            call.constraints,
                            ctx.node_group_size,
                            plan_pg,
                            call.planner_batch_size,
                            store=call.plan_store,
                            name=ctx.name,
                            paths=ctx.paths,
                        )
                ctx.plan = made.plan
                report.note_plan(ctx.name, made.cache, made.file, made.reason)
            else:
                report.note_plan(ctx.name, "given")
            check_fully_sharded_plan(ctx.strategy, ctx.plan)  # the same plan on every rank

    def mesh(self, contexts: list[ShardingContext], report: ConstructionReport) -> None:
        """Step 4: every context's 2D mesh and its two process groups (collective); contexts
        of one geometry share a mesh."""
        meshes: dict[tuple[int, str], Mesh2D] = {}
        for ctx in contexts:
            key = (ctx.sharding_group_size, ctx.replica_layout)
            if key not in meshes:
                with report.phase("mesh"):
                    meshes[key] = build_mesh(self.world_size, *key, self.device.type, self.rank)
            ctx.mesh = meshes[key]


def resolve_setup(module: nn.Module, args: tuple[object, ...], kwargs: dict[str, object]) -> Setup:
    """Step 1, validate: parse either call form and check every argument that does not
    depend on ``L`` against the model and the world."""
    call = parse_call(args, kwargs)
    device = validation.resolve_device(call.device)
    world_size, rank = validation.check_process_group(call.global_pg)
    check_world_size(call.world_size, world_size)
    layout = resolve_layout(call.replica_layout, call.use_inter_host_allreduce)
    validate_layout(layout)
    strategy = resolve_strategy(call.sharding_strategy)
    hook = adapt_custom_all_reduce(call.custom_all_reduce)
    note_ignored(call)
    call.plan_store = as_plan_store(call.plan_store)
    sharders = list(call.sharders) if call.sharders is not None else default_sharders()
    validation.check_shardable(module, sharders)
    validation.check_optimizers(module, sharders, device)
    mc_tables = check_managed_collision(module)
    pg = call.global_pg if call.global_pg is not None else dist.group.WORLD
    return Setup(
        call,
        device,
        world_size,
        rank,
        pg,
        call.sharding_group_size,
        layout,
        strategy,
        hook,
        sharders,
        mc_tables,
    )


def choose_layout(module: nn.Module, setup: Setup, size: int) -> list[ShardingContext]:
    """Step 2, layout at ``L = size``: the default context, then one per ``submodule_configs``
    entry, each with its group size, replica layout, node group size and strategy, and each
    checked against the sync options (pure; plans and meshes come later)."""
    call = setup.call
    default = ShardingContext(
        module_type=None,
        paths=[],
        sharding_group_size=size,
        replica_layout=setup.replica_layout,
        node_group_size=validation.resolve_node_group_size(
            call.node_group_size, size, setup.world_size // size, setup.replica_layout
        ),
        strategy=setup.strategy,
        plan=call.plan,
    )
    contexts = describe_contexts(
        module, setup.world_size, default, call.submodule_configs, setup.sharders
    )
    sync_options = call.sync_options or SyncOptions()
    for ctx in contexts:  # the option-conflict rules, per context's sharding strategy
        check_collection(sync_options, ctx.strategy.name, setup.mc_tables, setup.hook is not None)
    return contexts


def fixed_group_size(setup: Setup) -> int:
    """Step 2's ``L`` as the call gives it: required, an ``int`` dividing the world size."""
    value, world_size = setup.sharding_group_size, setup.world_size
    if value is None:
        raise ConfigError(
            "sharding_group_size is required: the ranks per sharding group, a divisor of "
            f"the world size {world_size}."
        )
    if value == "auto":
        raise ConfigError(
            "sharding_group_size='auto' is chosen by the advisor, above the core model: "
            "call sparse2d.DMPCollection(module, 'auto', ...), or pass the L that "
            "sparse2d.pick_group_size(module, ...) chooses."
        )
    validate_group_size(world_size, value)  # type: ignore[arg-type]
    return value  # type: ignore[return-value]
