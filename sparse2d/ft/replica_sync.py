"""Which replica sync a fault-tolerant group runs, and what it refuses.

The sync is ``sparse2d.sync``'s own (engines, MC identity merge, cadence, scaling) over
torchft's managed channel, installed as the model's policy so that ``model.sync()`` (a
user's, or a TorchRec pipeline's ``sync_embeddings``) averages into copies that the step's
commit writes back. Everything refused here is decided from local facts, on every rank,
before the lighthouse is reached or any collective runs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch.distributed as dist
import torch.nn as nn

from sparse2d.ft import in_world
from sparse2d.ft.ft_options import FTOptions
from sparse2d.ft.transport import ManagedChannel
from sparse2d.managed_collision import mc_sync_for, plain_shards
from sparse2d.option_conflicts import check_fault_tolerance
from sparse2d.sync.engines.dense import DenseEngine
from sparse2d.sync.engines.sparse import SparseEngine
from sparse2d.sync.options import SyncOptions
from sparse2d.sync.policy import SyncPolicy


def refuse(model: nn.Module) -> None:
    """Raise ``ConfigError`` for what the fault-tolerant sync cannot run, with the reason
    (``sparse2d.option_conflicts``' rules, as the trainer's config loader applies them)."""
    local = getattr(model, "sync_policy", None)
    check_fault_tolerance(
        getattr(local, "options", None) or SyncOptions(),
        fully_sharded=getattr(model, "fully_sharded", None) is not None,
        custom_all_reduce=getattr(local, "hook", None) is not None,
    )
    in_world.refuse(model)  # the default module's in-world replicas; per-module sizes


def install(
    model: nn.Module,
    options: FTOptions,
    channel: ManagedChannel,
    shards: list[Any],
    has_mc: bool,
) -> tuple[SyncPolicy, bool]:
    """Build the fault-tolerant policy, make it the model's, and return it with whether each
    rank must scan what it sends for NaN/inf (``check_finite``)."""
    local = model.sync_policy
    base = getattr(local, "options", None) or SyncOptions()
    # hide: the average lands at the commit, which is before the next lookup anyway.
    # NaN/inf: each rank scans what it sent and its flag rides the step's control all-reduce
    # (``FaultTolerance.finish_step``) instead of the guard's own vote over the group: a
    # group whose flag is set fails the commit everywhere, so nothing bad lands.
    # Touched rows: their metadata crosses the quorum too; auto runs dense (its choice is
    # learned from past syncs, which a group that joined by a heal has not seen).
    kind = "sparse" if base.engine == "sparse" else "dense"
    sync_options = dataclasses.replace(base, engine=kind, hide=False, check_finite=False)
    # Managed-collision tables: identities merged over the quorum by the in-world rules
    mc = mc_sync_for(model, shards, None, channel) if has_mc else None
    plain = plain_shards(shards, mc)
    engine = (
        SparseEngine(plain, None, crossover=1.0, channel=channel)
        if kind == "sparse"
        else DenseEngine(plain, None)
    )
    engine.pool = channel.arena  # type: ignore[assignment]  # copies gathered into the send
    stage1 = in_world.in_world_policies(model)  # modules with replicas inside this world
    policy = in_world.TwoStagePolicy(
        stage1,
        plain,
        None,
        options.num_groups,
        sync_options,
        engine=engine,
        global_pg=dist.group.WORLD,
        channel=channel,
        mc=mc,
    )
    local.close()  # G=1 in this world: the local policy never syncs; remove its hooks
    model.sync_policy = policy
    return policy, base.check_finite
