"""Plan once for ``L`` ranks, then remap the plan onto one sharding group's global ranks.

Every sharding group gets the identical plan (that is what makes its ranks
replicas of the other groups' ranks), so planning happens once, on global rank
0, and the result — or the planner's error — is broadcast to every rank. An
error therefore surfaces on all ranks instead of leaving ranks 1..T-1 blocked
in the broadcast. With a ``PlanStore`` the plan is made once per job: a restart
loads it (``plan_store``). Without a process group (the dry run) a rank plans
alone.
"""

from __future__ import annotations

import copy
import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed._shard.sharding_spec import EnumerableShardingSpec
from torch.distributed.remote_device import _remote_device
from torchrec.distributed.planner import Topology
from torchrec.distributed.planner.types import ParameterConstraints, ShardingOption
from torchrec.distributed.types import ModuleSharder, ShardingPlan, ShardingType

from sparse2d.comm_device import share_from_rank0
from sparse2d.errors import PlanError, StoredPlanError
from sparse2d.planner.fast_planner import group_planner, spread_constraints
from sparse2d.planner.plan_context import describe_context
from sparse2d.planner.plan_store import PlanStore

logger = logging.getLogger(__name__)

# Types whose shard count is fixed by the number of ranks the plan was made for.
_RANK_COUNT_TYPES = (ShardingType.ROW_WISE.value,)


@dataclass(slots=True)
class GroupPlan:
    """A context's plan for ranks ``0..L-1`` and where it came from."""

    plan: ShardingPlan
    cache: str = "none"
    """``hit`` (loaded from the store), ``miss`` (none stored: planned and stored), ``stale``
    (stored for another setup: planned afresh and replaced), ``none`` (no store)."""
    file: str | None = None
    reason: str = ""
    """For ``stale``: what changed since the stored plan was made."""


def plan_for_group(
    module: nn.Module,
    sharding_group_size: int,
    device_type: str,
    sharders: list[ModuleSharder[nn.Module]],
    constraints: dict[str, ParameterConstraints] | None,
    node_group_size: int,
    pg: dist.ProcessGroup | None,
    batch_size: int | None = None,
    *,
    store: PlanStore | None = None,
    name: str = "default",
    paths: list[str] | None = None,
) -> GroupPlan:
    """Plan ``module`` for ``sharding_group_size`` ranks (or load the stored plan).

    With a process group, rank 0 plans (or reads the store) and every rank receives the
    result, errors included. With ``pg=None`` this rank does it alone, with no collective:
    the dry run's path, where a fake process group moves no objects.
    """

    def _obtain() -> GroupPlan:
        args = (module, sharding_group_size, device_type, sharders, constraints, node_group_size)
        if store is None:
            return GroupPlan(_plan_locally(*args, batch_size))
        context = describe_context(
            module,
            paths if paths is not None else [""],
            sharders,
            constraints,
            sharding_group_size,
            node_group_size,
            device_type,
            batch_size,
        )
        found = store.lookup(name, context)
        if found.plan is not None:
            logger.info(
                "[sparse2d] %s plan for L=%d loaded from %s", name, sharding_group_size, found.file
            )
            return GroupPlan(found.plan, "hit", found.file)
        if found.cache == "stale":
            logger.warning(
                "[sparse2d] stored plan %s was made for another setup (%s); planning afresh",
                found.file,
                found.reason,
            )
        plan = _plan_locally(*args, batch_size)
        try:
            file = store.save(name, context, plan)
        except OSError as error:  # a read-only run dir costs the next start its planning only
            logger.warning("[sparse2d] could not store the plan in %s: %s", found.file, error)
            file = None
        return GroupPlan(plan, found.cache, file, found.reason)

    def obtain() -> GroupPlan:
        try:
            return _obtain()
        except StoredPlanError:
            raise
        except Exception as error:  # share_from_rank0 raises it on every rank
            raise PlanError(
                f"Planning the embedding tables for a sharding group of {sharding_group_size} "
                f"ranks failed: {error}\nFixes: 1. raise sharding_group_size above "
                f"{sharding_group_size} so each rank holds less; 2. relax or remove the "
                f"constraints on {sorted(constraints or {})}; 3. pass a hand-made plan= for "
                f"{sharding_group_size} ranks."
            ) from None

    return obtain() if pg is None else share_from_rank0(obtain, pg)


def _plan_locally(
    module: nn.Module,
    sharding_group_size: int,
    device_type: str,
    sharders: list[ModuleSharder[nn.Module]],
    constraints: dict[str, ParameterConstraints] | None,
    node_group_size: int,
    batch_size: int | None,
) -> ShardingPlan:
    topology = Topology(
        world_size=sharding_group_size,
        compute_device=device_type,
        local_world_size=node_group_size,
    )
    return plan_on_topology(module, topology, sharders, constraints, batch_size)[0]


def plan_on_topology(
    module: nn.Module,
    topology: Topology,
    sharders: list[ModuleSharder[nn.Module]],
    constraints: dict[str, ParameterConstraints] | None,
    batch_size: int | None,
) -> tuple[ShardingPlan, list[ShardingOption]]:
    """The one planning path of a sharding group: what ``DMPCollection`` builds (no process
    group, so a meta-device module plans too) and the placed options behind it, each shard's
    TorchRec perf and storage estimate included, for the advisor to price
    (``sparse2d.advisor.group_layout``)."""
    spread = spread_constraints(module, topology.world_size, constraints)
    planner = group_planner(topology, batch_size, spread)
    plan = planner.plan(module, sharders)
    return plan, list(planner._best_plan or [])  # TorchRec's own stats read the same list


def validate_plan(plan: ShardingPlan, sharding_group_size: int) -> None:
    """Raise ``PlanError`` if ``plan`` was not made for ``sharding_group_size`` ranks."""
    for module_path, module_plan in plan.plan.items():
        for table, sharding in module_plan.items():  # type: ignore[union-attr]
            ranks = list(sharding.ranks or [])
            where = f"table {table!r} of module {module_path!r}"
            if any(r < 0 or r >= sharding_group_size for r in ranks):
                raise PlanError(
                    f"The plan places {where} on ranks {ranks}, but the sharding group has "
                    f"{sharding_group_size} ranks (0..{sharding_group_size - 1}). A 2D plan is "
                    f"made for the sharding group, not the world: plan with "
                    f"Topology(world_size={sharding_group_size}) or pass plan=None."
                )
            if sharding.sharding_type in _RANK_COUNT_TYPES and len(ranks) != sharding_group_size:
                raise PlanError(
                    f"The plan shards {where} {sharding.sharding_type} over {len(ranks)} ranks, "
                    f"but row-wise sharding must span the whole sharding group of "
                    f"{sharding_group_size} ranks: plan with Topology(world_size="
                    f"{sharding_group_size}) or pass plan=None."
                )


def remap_plan(plan: ShardingPlan, sharding_group: list[int], device: torch.device) -> ShardingPlan:
    """Return a copy of ``plan`` (made for ranks 0..L-1) placed on ``sharding_group``.

    Shard placements become ``rank:<global>/cpu`` on CPU (TorchRec's own remap
    writes ``cuda:<k>`` unconditionally) and ``rank:<global>/cuda:<local>`` on CUDA.
    """
    remapped = copy.deepcopy(plan)
    for module_plan in remapped.plan.values():
        for sharding in module_plan.values():  # type: ignore[union-attr]
            if sharding.ranks is not None:
                sharding.ranks = [sharding_group[r] for r in sharding.ranks]
            spec = sharding.sharding_spec
            if isinstance(spec, EnumerableShardingSpec):
                for shard in spec.shards:
                    group_rank = shard.placement.rank()  # type: ignore[union-attr]
                    shard.placement = _placement(sharding_group[group_rank], device)
    return remapped


def _placement(global_rank: int, device: torch.device) -> _remote_device:
    if device.type == "cpu":
        return _remote_device(f"rank:{global_rank}/cpu")
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", torch.cuda.device_count() or 1))
    return _remote_device(f"rank:{global_rank}/{device.type}:{global_rank % local_size}")
