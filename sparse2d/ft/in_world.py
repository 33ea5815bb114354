"""Per-module group sizes under fault tolerance: replicas inside a torchrun world.

Under fault tolerance a world is one sharding group of the default module (``L`` = world
size). A module given a smaller ``L`` in ``submodule_configs`` has ``world / L`` replicas
inside the world, on top of the torchft groups. Its fault-tolerant sync runs in two stages:

1. over its in-world replica group (its own ``SyncPolicy``, blocking, in place): the world's
   replicas then agree, a valid 2D state even if the step later fails its commit;
2. over torchft's quorum with every other shard, into copies written back on the commit
   vote (``sparse2d.ft.fault_tolerant_steps``).

After a commit that is the equal-weight average over all ``G x (world / L)`` replicas: the
in-world replicas hold equal values, so averaging them first changes no weight. Both stages
run inside the managed policy's sync, so they share its cadence (``SyncOptions.every``, forced and
final syncs, ``model.sync()``) and run on every rank of the world, the in-world one first.
Every world builds the same plan, so a heal still goes rank to rank.

The quorum stage's options compose, because stage 1 leaves the world's ``n = world / L``
replicas equal:

- touched rows (``engine='sparse'``): stage 1 changed rows that only an in-world replica
  touched, so before stage 2 each rank stamps the rows any in-world replica touched
  (``SparseEngine.share_touched``, a MAX all-reduce of a bitmap over the in-world group);
  the quorum's union is then every row any of the ``G x n`` replicas touched;
- ``momentum_scaling``: stage 1 is unscaled; stage 2 divides the module's averaged growth
  by ``c = G x n`` (``AccumulatorScaler.average_within``), what in-world 2D divides by.
"""

from __future__ import annotations

import time
from typing import Any

import torch.nn as nn

from sparse2d.errors import ConfigError
from sparse2d.managed_collision.tables import find_mc_tables
from sparse2d.managed_collision.zch_sync import find_zch_tables
from sparse2d.sync.engines.sparse import SparseEngine
from sparse2d.sync.options import SyncOptions, SyncReport, merge_reports
from sparse2d.sync.policy import SyncPolicy


def replicated_contexts(model: nn.Module) -> list[Any]:
    """The model's sharding contexts with replicas inside this world (refusing the default
    module's: a world is one of its sharding groups)."""
    contexts = getattr(model, "contexts", None) or [model]
    default = getattr(contexts[0], "num_replicas", 1)
    if default != 1:
        raise ConfigError(
            f"fault tolerance needs one sharding group per torchrun world (sharding_group_size="
            f"world size for the default module); got {default} replicas in this world: "
            "replicas are the torchft groups (one torchrun per group)"
        )
    return [c for c in contexts[1:] if c.num_replicas != 1]


def layout_digest(model: nn.Module) -> str:
    """Every context's group size and in-world replicas, for the heal fingerprint."""
    contexts = getattr(model, "contexts", None) or []
    return ";".join(f"{c.name}:{c.sharding_group_size}x{c.num_replicas}" for c in contexts)


def in_world_policies(model: nn.Module) -> list[SyncPolicy]:
    """One exact, blocking, dense, unscaled ``SyncPolicy`` per context with in-world replicas
    (stage 1), after refusing what does not compose in two stages."""
    contexts = refuse(model)
    exact = SyncOptions(engine="dense", check_finite=False)  # stage 2 scans what it sends
    return [
        SyncPolicy(list(ctx.shards), ctx.replica_pg, ctx.num_replicas, exact) for ctx in contexts
    ]


def refuse(model: nn.Module) -> list[Any]:
    """The contexts with in-world replicas, once managed-collision tables in them are refused
    (``ConfigError``; local checks only, so every rank raises alike before the
    fault-tolerant group connects). Every sync option composes (module docstring)."""
    contexts = replicated_contexts(model)
    for ctx in contexts:
        if find_mc_tables(model, ctx.shards) or find_zch_tables(model, ctx.shards):
            raise ConfigError(
                f"fault tolerance with managed-collision tables in {ctx.name}, which has "
                "replicas inside the world: the identity merge averages a row over the "
                "replicas holding its id, and merged in two stages a world's holders would "
                "count as one (other weights than in-world 2D); give that module L = world size"
            )
    return contexts


class TwoStagePolicy(SyncPolicy):
    """The managed (quorum) ``SyncPolicy`` whose every sync first runs ``in_world`` (stage 1;
    none: exactly a ``SyncPolicy``)."""

    def __init__(self, in_world: list[SyncPolicy], *args: Any, **kwargs: Any) -> None:
        self.in_world = in_world
        super().__init__(*args, **kwargs)
        if self.scaler is not None:  # c = the quorum's groups x the module's in-world replicas
            for policy in in_world:
                self.scaler.average_within(policy.shards, policy.num_replicas)

    def _sync(self, step: int, *, states: bool, **kwargs: Any) -> SyncReport:
        if not self.in_world or self.channel.holding:  # a second sync in a step: stage 1 ran
            return super()._sync(step, states=states, **kwargs)
        reports = [p.sync_now(step, include_optimizer_state=states) for p in self.in_world]
        if isinstance(self.engine, SparseEngine):  # rows the in-world replicas touched
            began = time.perf_counter()
            sent = sum(self.engine.share_touched(p.shards, p.replica_pg) for p in self.in_world)
            reports.append(SyncReport(step, sent, time.perf_counter() - began))
        return merge_reports([*reports, super()._sync(step, states=states, **kwargs)])

    def reset(self) -> None:
        for policy in self.in_world:
            policy.reset()
        super().reset()

    def close(self) -> None:
        for policy in self.in_world:
            policy.close()
        super().close()
