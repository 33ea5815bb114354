"""One rank of an ``N``-rank job, built in this process on torch's fake process group.

``init_fake_world(rank, N, K)`` starts the ``"fake"`` backend (collectives return at once
and move no data), so ``DMPCollection`` builds exactly what rank ``rank`` of a real job
would: its mesh, its process groups, the plan for ``L`` (planned or loaded on the rank
itself: an object broadcast from rank 0 carries nothing under the fake backend), its
shards. ``rank_report`` describes what the rank holds. ``sparse2d dryrun`` (the trainer's
CLI) uses both for a trainer config; library users call them around their own model.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import torch.distributed as dist

from sparse2d.errors import ConfigError


def init_fake_world(rank: int, world_size: int, local_world_size: int | None = None) -> None:
    """Initialize the default process group as rank ``rank`` of ``world_size`` (fake backend).

    Sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` as torchrun would (the
    default node group size of table-row-wise sharding reads ``LOCAL_WORLD_SIZE``).
    """
    from torch.testing._internal.distributed.fake_pg import FakeStore

    local = local_world_size or min(world_size, 8)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(
            f"--rank {rank} must be in 0..{world_size - 1} (world size {world_size})."
        )
    if local < 1 or world_size % local:
        raise ConfigError(
            f"--local-world-size {local} must divide the world size {world_size} (ranks per host)."
        )
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank % local),
        LOCAL_WORLD_SIZE=str(local),
    )
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    _settle_collective_validation()


def _settle_collective_validation() -> None:
    """TorchRec's ``DistributedModelParallel.__init__`` broadcasts rank 0's "validate
    collectives" flag as an object (``collective_utils.init_collective_validation``); under the
    fake backend ranks != 0 then unpickle garbage. Each rank resolves the flag itself
    (TorchRec's own leader function: an env var and a knob, no rank-specific input) and marks
    it initialized, which is what the broadcast would have left."""
    from torchrec.distributed import collective_utils

    if getattr(collective_utils, "_INITIALIZED", True):
        return
    resolve = getattr(collective_utils, "_resolve_enablement_on_leader", None)
    collective_utils._USE_COLLECTIVE_VALIDATION = bool(resolve()) if resolve else False
    collective_utils._INITIALIZED = True


def rank_report(model: Any, groups: list[dist.ProcessGroup] | None = None) -> dict[str, Any]:
    """What this rank of a ``DMPCollection`` holds: bytes, shards, groups, construction."""
    weight_bytes = state_bytes = 0
    shards = []
    for s in model.shard_states:
        w = s.weight.numel() * s.weight.element_size()
        o = sum(t.numel() * t.element_size() for t in s.optimizer_states)
        weight_bytes, state_bytes = weight_bytes + w, state_bytes + o
        shards.append(
            {
                "table": s.table,
                "rows": [s.row_offset, s.row_offset + s.rows],
                "cols": [s.col_offset, s.col_offset + s.cols],
                "weight_bytes": w,
                "optimizer_state_bytes": o,
            }
        )
    report = layout_report(model.contexts, model.construction, groups)
    report.update(embedding_bytes=weight_bytes, optimizer_state_bytes=state_bytes, shards=shards)
    return report


def layout_report(
    contexts: list[Any], construction: Any, groups: list[dist.ProcessGroup] | None
) -> dict[str, Any]:
    """What ``rank_report`` says of a rank built or only planned (``plan_rank``): its
    default context's geometry, the plans' sharding types, the construction and its groups."""
    ctx = contexts[0]
    report: dict[str, Any] = {
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "sharding_group_size": ctx.sharding_group_size,
        "num_replicas": ctx.num_replicas,
        "replica_layout": ctx.replica_layout,
        "sharding_group": ctx.sharding_group,
        "replica_group": ctx.replica_group,
        "sharding_types": dict(
            Counter(
                sharding.sharding_type
                for c in contexts
                for module_plan in (c.plan.plan if c.plan is not None else {}).values()
                for sharding in module_plan.values()
            )
        ),
        "construction": construction.record(),
    }
    if groups is not None:
        sizes = dict(Counter(str(g.size()) for g in groups))
        report["process_groups"] = {"created": len(groups), "by_size": sizes}
    return report


def plan_rank(module: Any, *args: Any, **kwargs: Any) -> tuple[Any, list[Any], Any]:
    """``DMPCollection(module, *args, **kwargs)`` up to its plan, without sharding: steps 1-4
    of its construction (validate, L and layout, plan or load the stored plan, mesh), the
    plan remapped to this rank's groups. ``L`` is an ``int`` (a dry run's ``"auto"`` is
    resolved before, by the cost model's pick). Allocates
    no embedding storage, so a rank whose shards would not fit this machine can be described:
    returns ``(plan, contexts, construction_report)``; ``planned_shards`` reads the plan."""
    from sparse2d.core.collection_setup import choose_layout, fixed_group_size, resolve_setup
    from sparse2d.core.construction import ConstructionReport
    from sparse2d.core.contexts import remapped_plan

    setup = resolve_setup(module, args, kwargs)
    contexts = choose_layout(module, setup, fixed_group_size(setup))
    report = ConstructionReport()
    setup.plan(module, contexts, report)
    setup.mesh(contexts, report)
    return remapped_plan(contexts, setup.device), contexts, report


def planned_shards(
    plan: Any, rank: int, shapes: dict[str, tuple[int, int]], element_size: int = 4
) -> list[dict[str, Any]]:
    """The shards ``plan`` (remapped: global ranks) places on ``rank``, in ``rank_report``'s
    form without optimizer state; ``shapes`` maps a table to its ``(rows, dim)`` for tables
    planned without a sharding spec (data parallel: the whole table on every rank)."""
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec

    shards = []
    for module_plan in plan.plan.values():
        for table, sharding in module_plan.items():
            spec = sharding.sharding_spec
            if isinstance(spec, EnumerableShardingSpec):
                pieces = [
                    (s.shard_offsets, s.shard_sizes)
                    for s in spec.shards
                    if s.placement.rank() == rank
                ]
            elif sharding.ranks is None or rank in sharding.ranks:
                pieces = [([0, 0], list(shapes[table]))]
            else:
                pieces = []
            for (row, col), (rows, cols) in pieces:
                shards.append(
                    {
                        "table": table,
                        "rows": [row, row + rows],
                        "cols": [col, col + cols],
                        "weight_bytes": rows * cols * element_size,
                    }
                )
    return shards
