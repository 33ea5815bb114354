"""Refill restarted ranks from a healthy replica, over the replica group, without storage.

At thousands of ranks a restarted process (elastic restart, node swap) comes back
with freshly initialised shards. Its replicas hold the same shards, so copying
them over the replica group is faster than reading a checkpoint and loses no steps.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from sparse2d.errors import ConfigError
from sparse2d.managed_collision import mc_identity_buffers
from sparse2d.mesh import replica_groups
from sparse2d.sync.collectives import broadcast_
from sparse2d.sync.shards import flush_caches, live_tensors


def plan_repair(
    world_size: int, sharding_group_size: int, replica_layout: str, ranks: list[int]
) -> dict[int, int]:
    """``{replica-group index: source rank}`` for each group with a rank to repair (pure).

    The source is the lowest rank of the group not in ``ranks``. Raises ``ConfigError``
    (identically on every rank) for an unknown rank or a group with no healthy member.
    """
    bad = [r for r in ranks if not isinstance(r, int) or not 0 <= r < world_size]
    if bad:
        raise ConfigError(f"ranks to repair {bad} are not ranks of a world of {world_size}")
    broken = set(ranks)
    plan: dict[int, int] = {}
    for index, group in enumerate(replica_groups(world_size, sharding_group_size, replica_layout)):
        if not broken.intersection(group):
            continue
        healthy = [r for r in group if r not in broken]
        if not healthy:
            raise ConfigError(
                f"replica group {group} has no healthy member (all in ranks={sorted(broken)}); "
                f"restore these shards from a checkpoint with sparse2d.checkpoint.load"
            )
        plan[index] = min(healthy)
    return plan


def repair_from_replicas(model: nn.Module, ranks: list[int], include_dense: bool = True) -> None:
    """Overwrite the shards of ``ranks`` with a healthy replica's weights and optimizer state.

    Collective: every rank calls it with the same ``ranks``. Replica groups without a
    rank in ``ranks`` do nothing. Each sharding context (per-module group sizes) is
    repaired over its own replica groups. With ``include_dense``, dense parameters and
    buffers (replicated on every rank) are broadcast from the lowest healthy rank.
    """
    if getattr(model, "fully_sharded", None) is not None:  # same answer on every rank
        raise ConfigError(
            f"repair_from_replicas({sorted(ranks)}) is not possible with "
            "sharding_strategy=FULLY_SHARDED: each replica holds the only copy of its 1/G slice "
            "of the embedding buffers, so a lost rank cannot be refilled from its replicas. "
            "Restore with sparse2d.checkpoint.load (or train with sharding_strategy=DEFAULT)."
        )
    world = dist.get_world_size()
    contexts = getattr(model, "contexts", None) or [model]
    plans = [
        plan_repair(world, c.sharding_group_size, c.replica_layout, list(ranks)) for c in contexts
    ]  # every context checked before anything moves
    model.finish_sync()  # no transfer may land on top of the repaired values
    with torch.no_grad():
        for ctx, plan in zip(contexts, plans, strict=True):
            shards = ctx.shards if ctx is not model else model.shard_states
            group = ctx.replica_group
            source = next((src for src in plan.values() if src in group), None)
            if source is None:
                continue
            flush_caches(shards)
            tensors = live_tensors(shards, weights=True, states=True)
            kernels = {id(s.kernel): s.kernel for s in shards if s.kernel is not None}
            tensors += [kernel.iter for kernel in kernels.values()]  # Adam-style step counter
            owner = ctx.policy if ctx is not model else model.sync_policy
            tensors += mc_identity_buffers(owner)  # MC tables: ids move with their rows
            broadcast_(tensors, ctx.replica_pg, src_group_rank=group.index(source))
        if include_dense and any(plans):
            healthy = min(r for r in range(world) if r not in set(ranks))
            dense = [
                t
                for t in model.state_dict().values()
                if type(t) is torch.Tensor and t.is_floating_point()
            ]
            if dense:
                broadcast_(dense, dist.group.WORLD, src_group_rank=healthy)
    for policy in model.sync_policies:  # references taken before the repair are stale
        policy.reset()
