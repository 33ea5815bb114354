"""``DMPCollection``: TorchRec's ``DistributedModelParallel`` over one sharding group, replicated.

Construction order (each step logged): validate (pure, every rank) -> mesh ->
plan for ``L`` ranks -> remap to this rank's group -> shard with
``ShardingEnv2D`` -> align replicas (broadcast from replica-rank 0).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.types import ModuleSharder, ShardingEnv2D, ShardingPlan

from sparse2d import validation
from sparse2d.mesh import build_mesh, validate_group_size, validate_layout
from sparse2d.planner import default_sharders, plan_for_group, remap_plan, validate_plan
from sparse2d.planner.torchrec_fixes import apply_torchrec_fixes
from sparse2d.sync import (
    AllReduceHook,
    ShardState,
    broadcast_,
    collect_shard_states,
)
from sparse2d.sync.policy import SyncOptions, SyncPolicy, SyncReport
from sparse2d.sync.tensors import live_tensors

logger = logging.getLogger(__name__)


class DMPCollection(DistributedModelParallel):
    """Shard embedding tables over groups of ``sharding_group_size`` ranks; replicate the groups.

    Args:
        module: model holding TorchRec ``EmbeddingBagCollection``/``EmbeddingCollection``
            modules; may live on ``meta``. Give the embedding optimizer the TorchRec way
            (``apply_optimizer_in_backward``) or through sharder ``fused_params``.
        sharding_group_size: ranks per sharding group ``L``; must divide the world size.
        device: default ``cuda:LOCAL_RANK`` when CUDA is available, else ``cpu``.
        plan: a TorchRec ``ShardingPlan`` made for ``L`` ranks (ranks ``0..L-1``).
        constraints: ``{table: ParameterConstraints}`` for the built-in planner.
        sharders: default: sharders allowing every model-parallel type, on CPU too.
        replica_layout: ``"intra_host"`` (replicas on adjacent ranks) or ``"inter_host"``.
        global_pg: the job's process group (must span the world); default the default group.
        node_group_size: ranks of one group sharing a host, for TWRW/grid (divides ``L``).
        custom_all_reduce: ``hook(tensors, replica_pg)`` replacing the averaging all-reduce.
        planner_batch_size: per-rank batch size the planner assumes.
        sync_options: cadence and strategy of ``maybe_sync`` (default: every step, dense).
    """

    def __init__(
        self,
        module: nn.Module,
        sharding_group_size: int,
        *,
        device: torch.device | str | None = None,
        plan: ShardingPlan | None = None,
        constraints: dict[str, ParameterConstraints] | None = None,
        sharders: list[ModuleSharder[nn.Module]] | None = None,
        replica_layout: str = "intra_host",
        global_pg: dist.ProcessGroup | None = None,
        node_group_size: int | None = None,
        custom_all_reduce: AllReduceHook | None = None,
        planner_batch_size: int | None = None,
        sync_options: SyncOptions | None = None,
        init_data_parallel: bool = True,
    ) -> None:
        # 1. Validate: pure and identical on every rank, before any collective.
        resolved = validation.resolve_device(device)
        world_size, rank = validation.check_process_group(global_pg)
        validate_group_size(world_size, sharding_group_size)
        validate_layout(replica_layout)
        sharders = list(sharders) if sharders is not None else default_sharders()
        validation.check_shardable(module, sharders)
        if plan is not None:
            validate_plan(plan, sharding_group_size)
        validation.check_optimizers(module, sharders, resolved)
        num_groups = world_size // sharding_group_size
        node_size = validation.resolve_node_group_size(
            node_group_size, sharding_group_size, num_groups, replica_layout
        )
        pg = global_pg if global_pg is not None else dist.group.WORLD

        # 2. Mesh: the ("replicate", "shard") DeviceMesh and its two subgroups.
        mesh = build_mesh(world_size, sharding_group_size, replica_layout, resolved.type, rank)
        logger.info(
            "[sparse2d] mesh: %d groups x %d ranks (%s)",
            num_groups,
            sharding_group_size,
            replica_layout,
        )
        # 3. Plan once for L ranks (rank 0 plans, all receive), then remap to this group.
        if plan is None:
            plan = plan_for_group(
                module,
                sharding_group_size,
                resolved.type,
                sharders,
                constraints,
                node_size,
                pg,
                planner_batch_size,
            )
        group_plan = remap_plan(plan, mesh.sharding_group, resolved)
        logger.info(
            "[sparse2d] plan for %d ranks remapped to %s", sharding_group_size, mesh.sharding_group
        )
        # 4. Shard: TorchRec's DMP over the sharding group via ShardingEnv2D.
        apply_torchrec_fixes()
        env = ShardingEnv2D(
            sharding_pg=mesh.sharding_pg,
            replica_pg=mesh.replica_pg,
            global_pg=pg,
            device_mesh=mesh.device_mesh,
            node_group_size=node_size,
            use_inter_host_allreduce=replica_layout == "inter_host",
        )
        super().__init__(
            module,
            env=env,
            device=resolved,
            plan=group_plan,
            sharders=sharders,
            init_data_parallel=init_data_parallel,
        )
        self._mesh = mesh
        self._group_plan_for_l: ShardingPlan = plan
        self._sharding_group_size = sharding_group_size
        self._replica_layout = replica_layout
        self._shards: list[ShardState] = collect_shard_states(self)
        self.sync_policy = SyncPolicy(
            self._shards,
            mesh.replica_pg,
            len(mesh.replica_group),
            sync_options,
            custom_all_reduce,
            global_pg=pg,
        )
        # 5. Align replicas: TorchRec seeds each group's shards independently.
        self.align_replicas()
        logger.info("[sparse2d] replicas aligned over %s", mesh.replica_group)

    # ---- the 2D geometry -------------------------------------------------------------
    @property
    def sharding_pg(self) -> dist.ProcessGroup:
        return self._mesh.sharding_pg

    @property
    def replica_pg(self) -> dist.ProcessGroup:
        return self._mesh.replica_pg

    @property
    def device_mesh(self) -> DeviceMesh:
        return self._mesh.device_mesh

    @property
    def sharding_group_size(self) -> int:
        return self._sharding_group_size

    @property
    def num_replicas(self) -> int:
        return len(self._mesh.replica_group)

    @property
    def replica_layout(self) -> str:
        return self._replica_layout

    @property
    def sharding_group(self) -> list[int]:
        """Global ranks of this rank's sharding group."""
        return list(self._mesh.sharding_group)

    @property
    def replica_group(self) -> list[int]:
        """Global ranks holding the same shards as this rank."""
        return list(self._mesh.replica_group)

    @property
    def group_plan(self) -> ShardingPlan:
        """The plan as made for ranks ``0..L-1`` (before remapping to this group)."""
        return self._group_plan_for_l

    @property
    def shard_states(self) -> list[ShardState]:
        """Live views of this rank's embedding shards and their fused optimizer state."""
        return self._shards

    # ---- replica consistency ---------------------------------------------------------
    def align_replicas(self, include_optimizer_state: bool = True) -> None:
        """Overwrite every replica's shards with replica-rank 0's copy."""
        if self.num_replicas == 1:
            return
        tensors = live_tensors(self._shards, weights=True, states=include_optimizer_state)
        with torch.no_grad():
            broadcast_(tensors, self.replica_pg, src_group_rank=0)
        self.sync_policy.reset()

    def sync(self, include_optimizer_state: bool = True) -> SyncReport:
        """Average embedding weights and all fused optimizer state over the replica group.

        Routed through the sync policy so its engine, hook and compression apply; blocking,
        and it first lands any transfer still in flight from ``maybe_sync``.
        """
        return self.sync_policy.sync_now(include_optimizer_state=include_optimizer_state)

    def repair_from_replicas(self, ranks: list[int], include_dense: bool = True) -> None:
        """Refill ``ranks`` (e.g. restarted with fresh weights) from a healthy replica.

        Collective over the world: every rank calls it with the same ``ranks``. No storage is
        read; see ``sparse2d.checkpoint.repair``.
        """
        from sparse2d.checkpoint.repair import repair_from_replicas

        repair_from_replicas(self, ranks, include_dense)

    def maybe_sync(self, step: int) -> SyncReport | None:
        """Sync if the policy's cadence says step ``step`` (0-based) ends an interval."""
        return self.sync_policy.step(step)

    def set_all_reduce_hook(self, hook: AllReduceHook | None) -> None:
        """Replace the averaging all-reduce (``hook(tensors, replica_pg)`` averages in place)."""
        self.sync_policy.hook = hook

    def extra_repr(self) -> str:
        return (
            f"sharding_group_size={self._sharding_group_size}, num_replicas={self.num_replicas}, "
            f"replica_layout={self._replica_layout!r}"
        )

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError(
            "DMPCollection holds process groups and cannot be pickled; save state_dict()."
        )
