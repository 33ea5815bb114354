"""Managed-collision tables (TorchRec MCH and MP-ZCH) in 2D: replicas agree on ids before
averaging.

``tables`` finds them and refuses what cannot be synced, ``merge`` is the pure MCH identity
merge, ``sync`` the collective that applies it, ``zch_sync`` the MP-ZCH merge.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from sparse2d.managed_collision.sync import ManagedCollisionSync, identity_buffers
from sparse2d.managed_collision.tables import find_mc_tables
from sparse2d.managed_collision.zch_sync import find_zch_tables, zch_identity_buffers
from sparse2d.sync.shards import ShardState

__all__ = ["ManagedCollisionSync", "mc_identity_buffers", "mc_sync_for", "plain_shards"]


def mc_sync_for(
    model: nn.Module,
    shards: list[ShardState],
    replica_pg: dist.ProcessGroup | None,
    channel: Any = None,
) -> ManagedCollisionSync:
    """The MC sync of the MCH tables among ``shards`` (possibly none: every rank of a model
    with MC tables runs the same collectives at each sync); ``channel``: torchft's managed
    channel instead of ``replica_pg`` (``sparse2d.ft``)."""
    return ManagedCollisionSync(
        find_mc_tables(model, shards), replica_pg, find_zch_tables(model, shards), channel
    )


def plain_shards(shards: list[ShardState], mc: ManagedCollisionSync | None) -> list[ShardState]:
    """``shards`` less those the MC sync owns."""
    if mc is None:
        return shards
    owned = {id(s) for s in mc.shards}
    return [s for s in shards if id(s) not in owned]


def mc_identity_buffers(policy: Any) -> list[torch.Tensor]:
    """The identity buffers of ``policy``'s MC tables (none without), for broadcasts."""
    mc = getattr(policy, "mc", None)
    if mc is None:
        return []
    return identity_buffers(mc.tables) + zch_identity_buffers(mc.zch_tables)
