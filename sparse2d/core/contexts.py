"""Sharding contexts: one 2D layout per group of embedding modules.

A default context holds every shardable module; each ``submodule_configs`` entry adds one per
module type (matched exactly, as TorchRec does), with its own group size, layout, mesh, plan
and sync policy. ``describe_contexts`` is pure; each context is planned and meshed by the
construction's steps 3-4 (``sparse2d.core.collection_setup.Setup``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

import torch
import torch.distributed as dist
import torch.nn as nn
from torchrec.distributed.types import (
    DMPCollectionConfig,
    ModuleSharder,
    ShardingEnv2D,
    ShardingPlan,
    ShardingStrategy,
)

from sparse2d.core.call_forms import resolve_strategy
from sparse2d.errors import ConfigError
from sparse2d.mesh import Mesh2D, validate_group_size, validate_layout
from sparse2d.planner import remap_plan, validate_plan
from sparse2d.sync.shards import ShardState, collect_shard_states
from sparse2d.validation import resolve_node_group_size

T = TypeVar("T")

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from sparse2d.sync.policy import SyncPolicy


@dataclass(slots=True)
class ShardingContext:
    """One 2D layout: the modules it covers, its geometry, and (once built) its state."""

    module_type: type[nn.Module] | None
    """The configured module class; ``None`` for the default context."""
    paths: list[str]
    """Module paths (in the unsharded model) this context shards."""
    sharding_group_size: int
    replica_layout: str
    node_group_size: int
    strategy: ShardingStrategy
    plan: ShardingPlan | None
    """The plan for ranks ``0..L-1`` (``None`` until planned)."""
    mesh: Mesh2D | None = None
    shards: list[ShardState] = field(default_factory=list)
    policy: SyncPolicy | None = None

    @property
    def name(self) -> str:
        return "default" if self.module_type is None else self.module_type.__name__

    def _built(self) -> Mesh2D:
        if self.mesh is None:
            raise RuntimeError(f"sharding context {self.name} has no mesh yet")
        return self.mesh

    @property
    def sharding_pg(self) -> dist.ProcessGroup:
        return self._built().sharding_pg

    @property
    def replica_pg(self) -> dist.ProcessGroup:
        return self._built().replica_pg

    @property
    def device_mesh(self) -> DeviceMesh:
        return self._built().device_mesh

    @property
    def sharding_group(self) -> list[int]:
        return list(self._built().sharding_group)

    @property
    def replica_group(self) -> list[int]:
        return list(self._built().replica_group)

    @property
    def num_replicas(self) -> int:
        return len(self._built().replica_group)


def describe_contexts(
    module: nn.Module,
    world_size: int,
    default: ShardingContext,
    configs: list[DMPCollectionConfig] | None,
    sharders: list[ModuleSharder[nn.Module]],
) -> list[ShardingContext]:
    """The default context plus one per submodule config, validated (pure).

    Fills ``paths`` of every context; the default keeps the shardable modules no config
    claims. A default plan may still hold entries of claimed modules (TorchRec's own
    tests plan the whole model first); those entries are replaced by the config's plan.
    """
    sharder_types = {s.module_type for s in sharders}
    contexts = [default]
    claimed: set[str] = set()
    for index, config in enumerate(configs or []):
        where = f"submodule_configs[{index}]"
        if not isinstance(config, DMPCollectionConfig):
            raise ConfigError(
                f"{where}={config!r} is not a torchrec DMPCollectionConfig; build it with "
                "torchrec.distributed.types.DMPCollectionConfig(module=..., plan=..., "
                "sharding_group_size=...)."
            )
        kind = config.module
        if not isinstance(kind, type) or kind not in sharder_types:
            names = sorted(t.__name__ for t in sharder_types)
            raise ConfigError(
                f"{where}.module={kind!r} has no sharder; use one of {names} (a class, "
                "not an instance) or pass a sharder for it in sharders=."
            )
        if any(c.module_type is kind for c in contexts):
            raise ConfigError(f"{where}: module type {kind.__name__} is configured twice.")
        paths = [name for name, sub in module.named_modules() if type(sub) is kind]
        if not paths:
            raise ConfigError(
                f"{where}.module={kind.__name__} does not occur in the model; drop the config "
                "or fix the module type."
            )
        try:
            context = _context_of(config, kind, paths, world_size)
        except ConfigError as error:  # name the entry; PlanError stays a PlanError
            raise type(error)(f"{where} ({kind.__name__}): {error}") from None
        claimed.update(paths)
        contexts.append(context)
    types = tuple(sharder_types)
    default.paths = [
        name
        for name, sub in module.named_modules()
        if isinstance(sub, types) and name not in claimed and not _inside(name, claimed)
    ]
    if default.plan is not None:
        default.plan = unclaimed_plan(default.plan, claimed)
        validate_plan(default.plan, default.sharding_group_size)
    return contexts


def _context_of(
    config: DMPCollectionConfig, kind: type[nn.Module], paths: list[str], world_size: int
) -> ShardingContext:
    size = config.sharding_group_size
    validate_group_size(world_size, size)
    layout = "inter_host" if config.use_inter_host_allreduce else "intra_host"
    validate_layout(layout)
    context = ShardingContext(
        module_type=kind,
        paths=paths,
        sharding_group_size=size,
        replica_layout=layout,
        node_group_size=resolve_node_group_size(
            config.node_group_size, size, world_size // size, layout
        ),
        strategy=resolve_strategy(config.sharding_strategy),
        plan=config.plan,
    )
    if context.plan is not None:
        validate_plan(context.plan, size)
    return context


def _inside(path: str, parents: set[str]) -> bool:
    return any(path.startswith(parent + ".") for parent in parents)


def unclaimed_plan(plan: ShardingPlan, claimed: set[str]) -> ShardingPlan:
    """``plan`` without the module entries some submodule config replaces."""
    return ShardingPlan(
        plan={p: s for p, s in plan.plan.items() if p not in claimed and not _inside(p, claimed)}
    )


def sharders_for(
    context: ShardingContext,
    contexts: list[ShardingContext],
    sharders: list[ModuleSharder[nn.Module]],
) -> list[ModuleSharder[nn.Module]]:
    """The sharders a context plans with: its own type, or (default) every unclaimed type."""
    if context.module_type is not None:
        return [s for s in sharders if s.module_type is context.module_type]
    claimed = {c.module_type for c in contexts if c.module_type is not None}
    return [s for s in sharders if s.module_type not in claimed]


def sharding_env(ctx: ShardingContext, pg: dist.ProcessGroup) -> ShardingEnv2D:
    """TorchRec's 2D environment for the modules of one context.

    FULLY_SHARDED is sparse2d's own (``sparse2d.core.fully_sharded``, installed after
    sharding): TorchRec must build its plain fused kernels, not its CUDA-only
    ``ShardedBatchedFusedEmbedding*`` with the inexact reduce-scatter-after-lookup order.
    """
    strategy = ctx.strategy
    if strategy == ShardingStrategy.FULLY_SHARDED:
        strategy = ShardingStrategy.DEFAULT
    return ShardingEnv2D(
        sharding_pg=ctx.sharding_pg,
        replica_pg=ctx.replica_pg,
        global_pg=pg,
        device_mesh=ctx.device_mesh,
        node_group_size=ctx.node_group_size,
        use_inter_host_allreduce=ctx.replica_layout == "inter_host",
        sharding_strategy=strategy,
    )


def remapped_plan(contexts: list[ShardingContext], device: torch.device) -> ShardingPlan:
    """Every context's plan remapped from ranks ``0..L-1`` to this rank's sharding group,
    merged: the plan TorchRec's DMP shards with (pure, once planned and meshed)."""
    plan = ShardingPlan(plan={})
    for ctx in contexts:
        if ctx.plan is None:
            raise RuntimeError(f"sharding context {ctx.name} has no plan yet")
        plan.plan.update(remap_plan(ctx.plan, ctx.sharding_group, device).plan)
    return plan


def describe_layout(contexts: list[ShardingContext], world_size: int) -> str:
    """Each context's L and layout in one line, for the construction's log."""
    return "; ".join(
        f"{c.name}: L={c.sharding_group_size} x {world_size // c.sharding_group_size} "
        f"replicas ({c.replica_layout}, {c.strategy.name}, {len(c.paths)} modules)"
        for c in contexts
    )


def assign_shards(contexts: list[ShardingContext], model: nn.Module) -> list[ShardState]:
    """Give every context the local shards of its modules (the default: the rest, found
    from ``model``, the sharded DMP); return them all."""
    taken: set[int] = set()
    for ctx in contexts[1:]:
        ctx.shards = [
            s for path in ctx.paths for s in collect_shard_states(model.module.get_submodule(path))
        ]
        taken.update(id(s.kernel) for s in ctx.shards)
    contexts[0].shards = [s for s in collect_shard_states(model) if id(s.kernel) not in taken]
    return [s for c in contexts for s in c.shards]


def geometry_repr(contexts: list[ShardingContext]) -> str:
    """A model's geometry in its ``repr``: the default context's, then each configured one's L."""
    default = contexts[0]
    sizes = ", ".join(f"{c.name}: L={c.sharding_group_size}" for c in contexts[1:])
    return (
        f"sharding_group_size={default.sharding_group_size}, "
        f"num_replicas={default.num_replicas}, replica_layout={default.replica_layout!r}"
        + (f", submodules=({sizes})" if sizes else "")
    )


class DefaultContextAttr(Generic[T]):
    """A read-only ``DMPCollection`` attribute read from its default context (the model's
    ``_contexts[0]``): the model's 2D geometry is its default context's."""

    def __init__(self, name: str, doc: str = "") -> None:
        self.name = name
        self.__doc__ = doc or f"The default context's ``{name}``."

    @overload
    def __get__(self, model: None, owner: type) -> DefaultContextAttr[T]: ...
    @overload
    def __get__(self, model: object, owner: type) -> T: ...
    def __get__(self, model: Any, owner: type) -> Any:
        if model is None:
            return self
        return getattr(model._contexts[0], self.name)
