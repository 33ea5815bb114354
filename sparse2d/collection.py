"""``DMPCollection``: TorchRec's ``DistributedModelParallel`` over one sharding group, replicated.

Construction order (each step logged): validate (pure, every rank) -> mesh ->
plan for ``L`` ranks -> remap to this rank's group -> shard with
``ShardingEnv2D`` -> align replicas (broadcast from replica-rank 0). With
TorchRec's ``submodule_configs`` every configured module type gets its own
context (group size, mesh, plan, replica sync; see ``sparse2d.contexts``).

Why a subclass of TorchRec's own ``DMPCollection``: TorchRec's train pipelines
(``TrainPipelineSparseDist``, ``TrainPipelineSemiSync``, ...) sync replicas in
``TrainPipeline.sync_embeddings``, which calls ``model.sync()`` every
``dmp_collection_sync_interval_batches`` batches only if ``isinstance(model,
torchrec.distributed.model_parallel.DMPCollection)``. Being an instance is the one
hook-up that needs no change to a user's loop, and it routes the pipeline through
*our* ``sync()`` (policy, engines, hook, compression). TorchRec's constructor is never
run: it asserts a CUDA/MTIA device and builds TorchRec's own groups and sync caches.
``__init__`` calls ``DistributedModelParallel.__init__`` itself, and every method of
TorchRec's class reachable after construction is overridden here (``sync``,
``set_all_reduce_hook``, ``ensure_reduce_scatter_complete``, ``device_mesh``,
``_shard_modules_impl``); TorchRec's private sync helpers (``_sync``,
``_allreduce_tensors``, ...) are only called by those and stay unreached.
``tests/test_torchrec_compat.py`` checks that public surface for the installed TorchRec.
"""

from __future__ import annotations

import logging
import os
import weakref
from typing import Any, overload

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.model_parallel import DMPCollection as TorchRecDMPCollection
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.types import (
    DMPCollectionConfig,
    ModuleSharder,
    ShardedModule,
    ShardingPlan,
    ShardingStrategy,
)

from sparse2d import validation
from sparse2d.advisor.auto import AUTO, auto_group_size
from sparse2d.compat import (
    adapt_all_reduce,
    check_world_size,
    note_ignored,
    parse_call,
    resolve_layout,
    resolve_strategy,
)
from sparse2d.construction import ConstructionReport
from sparse2d.contexts import (
    DefaultContextView,
    ShardingContext,
    describe_contexts,
    plan_context,
    sharding_env,
)
from sparse2d.errors import ConfigError
from sparse2d.group_refs import ClosedGroup, drop_references
from sparse2d.mesh import Mesh2D, build_mesh, validate_group_size, validate_layout
from sparse2d.patches import apply_all
from sparse2d.patches.torchrec_comm import forget_destroyed_groups
from sparse2d.planner import default_sharders, remap_plan
from sparse2d.planner.plan_store import PlanStore, as_plan_store
from sparse2d.replica_sync import ReplicaSync
from sparse2d.resources import GroupRecorder, Resources
from sparse2d.sync.collectives import AllReduceHook
from sparse2d.sync.ddp_vote import EarlySync
from sparse2d.sync.fully_sharded import FullyShardedEmbeddings
from sparse2d.sync.fully_sharded.checks import (
    check_fully_sharded_options,
    check_fully_sharded_plan,
)
from sparse2d.sync.fully_sharded.surfaces import (
    GuardedOptimizer,
    GuardedSurfaces,
    guard_sharded_modules,
)
from sparse2d.sync.mc import mc_sync_for, plain_shards
from sparse2d.sync.mc.pipelines import install_pipeline_guard
from sparse2d.sync.mc.tables import check_managed_collision
from sparse2d.sync.multi import PolicySet
from sparse2d.sync.policy import SyncOptions, SyncPolicy
from sparse2d.sync.tensors import ShardState, collect_shard_states

logger = logging.getLogger(__name__)
FS = ShardingStrategy.FULLY_SHARDED


class DMPCollection(GuardedSurfaces, ReplicaSync, DefaultContextView, TorchRecDMPCollection):
    """Shard embedding tables over groups of ``sharding_group_size`` ranks; replicate the groups.

    Two call forms (``sparse2d.compat``): ``DMPCollection(module, L, *, device=..., ...)``
    and TorchRec's unchanged ``DMPCollection(module, device, plan, world_size,
    sharding_group_size, global_pg, sharding_strategy, node_group_size, sharders,
    init_data_parallel, init_parameters, data_parallel_wrapper, use_inter_host_allreduce,
    custom_all_reduce, submodule_configs, rs_awaitable_hook_module, use_sharded_relay)``.

    Args:
        module: model holding TorchRec ``EmbeddingBagCollection``/``EmbeddingCollection``
            modules; may live on ``meta``. Give the embedding optimizer the TorchRec way
            (``apply_optimizer_in_backward``) or through sharder ``fused_params``.
        sharding_group_size: ranks per sharding group ``L``; must divide the world size;
            ``"auto"`` asks the group-size advisor (``sparse2d plan`` shows its table).
        device: default ``cuda:LOCAL_RANK`` when CUDA is available, else ``cpu``.
        plan: a TorchRec ``ShardingPlan`` made for ``L`` ranks (ranks ``0..L-1``).
        world_size: optional; must equal the process group's size.
        constraints: ``{table: ParameterConstraints}`` for the built-in planner.
        sharders: default: sharders allowing every model-parallel type, on CPU too.
        replica_layout: ``"intra_host"`` (replicas on adjacent ranks) or ``"inter_host"``;
            TorchRec's ``use_inter_host_allreduce=True`` means ``"inter_host"``.
        global_pg: the job's process group (must span the world); default the default group.
        sharding_strategy: TorchRec's ``ShardingStrategy``: ``DEFAULT``, ``PER_MODULE`` or
            ``FULLY_SHARDED`` (between steps each replica holds 1/G of the fused embedding
            buffers, weights and optimizer state averaged every step by reduce-scatter; see
            ``sparse2d.sync.fully_sharded``). Also per ``submodule_configs`` entry.
        node_group_size: ranks of one group sharing a host, for TWRW/grid (divides ``L``).
        custom_all_reduce: ``hook(tensors, replica_pg)`` or TorchRec's ``hook(tensors)``,
            replacing the averaging all-reduce (see ``compat.adapt_all_reduce``).
        submodule_configs: TorchRec ``DMPCollectionConfig`` per module type with its own
            group size, layout and plan (``plan=None``: planned here).
        init_data_parallel, init_parameters, data_parallel_wrapper: as in TorchRec's DMP.
        planner_batch_size: per-rank batch size the planner assumes.
        sync_options: cadence and strategy of ``maybe_sync`` (default: every step, dense).
        plan_store: a directory (or ``PlanStore``) where the plan for ``L`` is stored and
            reused by every later construction with the same tables, sharders, constraints,
            ``L`` and TorchRec version (a restart plans no more); another setup replans with a
            log line saying what changed. A ``.json`` file is one stored plan that must match
            (``StoredPlanError`` otherwise). ``model.construction`` reports the phases' seconds
            and whether the plan was loaded.
    """

    @overload
    def __init__(
        self,
        module: nn.Module,
        sharding_group_size: int | str,
        *,
        device: torch.device | str | None = None,
        plan: ShardingPlan | None = None,
        constraints: dict[str, ParameterConstraints] | None = None,
        sharders: list[ModuleSharder[nn.Module]] | None = None,
        replica_layout: str | None = None,
        global_pg: dist.ProcessGroup | None = None,
        node_group_size: int | None = None,
        custom_all_reduce: AllReduceHook | None = None,
        planner_batch_size: int | None = None,
        sync_options: SyncOptions | None = None,
        plan_store: str | os.PathLike[str] | PlanStore | None = None,
        init_data_parallel: bool = True,
        submodule_configs: list[DMPCollectionConfig] | None = None,
        sharding_strategy: ShardingStrategy = ShardingStrategy.DEFAULT,
    ) -> None: ...

    @overload
    def __init__(
        self,
        module: nn.Module,
        device: torch.device | str | None,
        plan: ShardingPlan | None,
        world_size: int | None,
        sharding_group_size: int,
        global_pg: dist.ProcessGroup | None,
        sharding_strategy: ShardingStrategy = ShardingStrategy.DEFAULT,
        node_group_size: int | None = None,
        sharders: list[ModuleSharder[nn.Module]] | None = None,
        init_data_parallel: bool = True,
        init_parameters: bool = True,
        data_parallel_wrapper: Any = None,
        use_inter_host_allreduce: bool = False,
        custom_all_reduce: Any = None,
        submodule_configs: list[DMPCollectionConfig] | None = None,
        rs_awaitable_hook_module: str | None = None,
        use_sharded_relay: bool = False,
    ) -> None: ...

    def __init__(self, module: nn.Module, *args: Any, **kwargs: Any) -> None:
        # 1. Validate: pure and identical on every rank, before any collective.
        call = parse_call(args, kwargs)
        resolved = validation.resolve_device(call.device)
        world_size, rank = validation.check_process_group(call.global_pg)
        check_world_size(call.world_size, world_size)
        group_size = call.sharding_group_size
        if group_size is None:
            raise ConfigError(
                "sharding_group_size is required: the ranks per sharding group, a divisor of "
                f"the world size {world_size}."
            )
        if group_size == AUTO:  # the advisor decides on rank 0 and broadcasts (same L everywhere)
            group_size = auto_group_size(
                module, world_size, resolved,
                call.global_pg if call.global_pg is not None else dist.group.WORLD,
                call.planner_batch_size, call.sync_options,
                resolve_layout(call.replica_layout, call.use_inter_host_allreduce),
                call.constraints,
            )  # fmt: skip
        validate_group_size(world_size, group_size)  # type: ignore[arg-type]
        layout = resolve_layout(call.replica_layout, call.use_inter_host_allreduce)
        validate_layout(layout)
        strategy = resolve_strategy(call.sharding_strategy)
        hook = adapt_all_reduce(call.custom_all_reduce)
        note_ignored(call)
        call.plan_store = as_plan_store(call.plan_store)
        sharders = list(call.sharders) if call.sharders is not None else default_sharders()
        validation.check_shardable(module, sharders)
        validation.check_optimizers(module, sharders, resolved)
        default = ShardingContext(
            module_type=None,
            paths=[],
            sharding_group_size=group_size,  # type: ignore[arg-type]
            replica_layout=layout,
            node_group_size=validation.resolve_node_group_size(
                call.node_group_size,
                group_size,
                world_size // group_size,
                layout,  # type: ignore[operator]
            ),
            strategy=strategy,
            plan=call.plan,
        )
        contexts = describe_contexts(module, world_size, default, call.submodule_configs, sharders)
        for ctx in contexts:
            check_fully_sharded_options(ctx.strategy, call.sync_options)
        has_mc = check_managed_collision(
            module,
            momentum_scaling=(call.sync_options or SyncOptions()).momentum_scaling,
            hook=hook,
            strategies=[c.strategy for c in contexts],
        )
        pg = call.global_pg if call.global_pg is not None else dist.group.WORLD
        self._resources = Resources("DMPCollection")
        groups = self._groups = GroupRecorder(on_destroyed=forget_destroyed_groups)
        # A model dropped without close() still releases its groups when it is collected;
        # the finalizer holds the groups only, never the model.
        release_groups = weakref.finalize(self, groups.destroy)
        release_groups.atexit = False  # at interpreter exit the process takes them down
        self._resources.callback(release_groups)
        try:
            with groups.recording():
                self._build(
                    module, call, contexts, sharders, resolved, world_size, rank, pg, hook, has_mc
                )
        except BaseException:
            self._resources.close()  # a failed construction leaves no group behind
            raise

    def _build(
        self,
        module: nn.Module,
        call: Any,
        contexts: list[ShardingContext],
        sharders: list[ModuleSharder[nn.Module]],
        resolved: torch.device,
        world_size: int,
        rank: int,
        pg: dist.ProcessGroup,
        hook: AllReduceHook | None,
        has_mc: bool,
    ) -> None:
        """Steps 2-6 (collective); every process group they create is released by ``close``.
        ``has_mc``: the model has managed-collision tables (``sparse2d.sync.mc``)."""
        # 2. Mesh per context: the ("replicate", "shard") DeviceMesh and its two subgroups.
        # 3. Plan once per context for its L ranks (rank 0 plans, all receive; under the fake
        #    backend of a dry run each rank plans alone), or load the stored plan; then remap.
        plan = ShardingPlan(plan={})
        meshes: dict[tuple[int, str], Mesh2D] = {}  # contexts of one geometry share its groups
        report = self.construction = ConstructionReport()
        store = call.plan_store
        plan_pg = None if dist.get_backend(pg) == "fake" else pg
        for ctx in contexts:
            key = (ctx.sharding_group_size, ctx.replica_layout)
            if key not in meshes:
                with report.phase("mesh"):
                    meshes[key] = build_mesh(world_size, *key, resolved.type, rank)
            ctx.mesh = meshes[key]
            logger.info(
                "[sparse2d] %s mesh: %d groups x %d ranks (%s)",
                ctx.name,
                world_size // ctx.sharding_group_size,
                ctx.sharding_group_size,
                ctx.replica_layout,
            )
            if ctx.plan is None:
                with report.phase("plan"):
                    made = plan_context(
                        ctx, contexts, module, sharders, resolved.type, plan_pg, call.constraints,
                        call.planner_batch_size, store,
                    )  # fmt: skip
                ctx.plan = made.plan
                report.note_plan(ctx.name, made.cache, made.file, made.reason)
            else:
                report.note_plan(ctx.name, "given")
            check_fully_sharded_plan(ctx.strategy, ctx.plan)  # the same plan on every rank
            plan.plan.update(remap_plan(ctx.plan, ctx.sharding_group, resolved).plan)
        # 4. Shard: TorchRec's DMP, each module type with its context's ShardingEnv2D.
        apply_all()  # TorchRec/FBGEMM workarounds still needed (sparse2d.patches)
        install_pipeline_guard()
        self._envs_by_type = {c.module_type: sharding_env(c, pg) for c in contexts}
        with report.phase("shard"):
            DistributedModelParallel.__init__(
                self,
                module,
                env=self._envs_by_type[None],
                device=resolved,
                plan=plan,
                sharders=sharders,
                init_data_parallel=call.init_data_parallel,
                init_parameters=call.init_parameters,
                data_parallel_wrapper=call.data_parallel_wrapper,
            )
        self._contexts = contexts
        self._assign_shards()
        sliced = [c for c in contexts if c.strategy == FS and c.num_replicas > 1]
        for ctx in contexts:
            mc = mc_sync_for(self, ctx.shards, ctx.replica_pg) if has_mc else None
            ctx.policy = SyncPolicy(
                [] if ctx in sliced else plain_shards(ctx.shards, mc),  # FULLY_SHARDED: every step
                ctx.replica_pg,
                ctx.num_replicas,
                call.sync_options,
                hook,
                global_pg=pg,
                mc=mc,
            )
        policies = [c.policy for c in contexts if c.policy is not None]
        self.sync_policy: SyncPolicy | PolicySet = (
            policies[0] if len(policies) == 1 else PolicySet(policies)
        )
        self._early = EarlySync(self, self.sync_policy)  # syncs run at the end of a backward
        self._resources.callback(self._early.close)
        # 5. Align replicas: TorchRec seeds each group's shards independently.
        self._fully_sharded: FullyShardedEmbeddings | None = None
        with report.phase("align"):
            self.align_replicas()
        logger.info("[sparse2d] replicas aligned over %s", contexts[0].replica_group)
        # 6. FULLY_SHARDED contexts: keep this replica's 1/G slice, free the rest.
        self._resources.callback(self.sync_policy.close)
        if sliced:
            groups = [(c.shards, c.replica_pg) for c in sliced]
            self._fully_sharded = FullyShardedEmbeddings(groups, pg)
            self._resources.callback(self._fully_sharded.close)
            for handle in guard_sharded_modules(self, self._fully_sharded):
                self._resources.callback(handle.remove)
            logger.info("[sparse2d] FULLY_SHARDED: %s", [(c.name, c.num_replicas) for c in sliced])
        self._optim = GuardedOptimizer(self._optim, self._before_surface)

    # ---- lifetime ----------------------------------------------------------------------
    def close(self) -> None:
        """Release what this model created: sync hooks and transfers in flight, the
        FULLY_SHARDED hooks, and its process groups (the 2D mesh's, TorchRec's TWRW/grid
        groups; never ``global_pg`` or the default group). Local to the rank, no collective;
        a second call does nothing; forward/sync afterwards raise a clear error. The groups'
        threads and sockets end here, not at a later garbage collection: every reference
        the model holds to them is replaced by a ``ClosedGroup`` (``sparse2d.group_refs``)."""
        if self._resources.closed:
            return
        groups = list(self._groups.groups)
        self._resources.close()
        drop_references(self, groups, lambda g: ClosedGroup(g.group_name, "DMPCollection"))

    @property
    def closed(self) -> bool:
        return self._resources.closed

    def __enter__(self) -> DMPCollection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._resources.check_open("run forward")
        self._early.raise_error()
        if self._fully_sharded is not None:  # start the weight all-gathers before input dist
            self._fully_sharded.prefetch()
        return super().forward(*args, **kwargs)

    def _shard_modules_impl(
        self,
        module: nn.Module,
        path: str = "",
        module_id_cache: dict[int, ShardedModule] | None = None,
    ) -> nn.Module:
        """TorchRec DMP's sharding walk, with a configured module type's own environment."""
        env = self._envs_by_type.get(type(module))
        if env is None:
            return DistributedModelParallel._shard_modules_impl(self, module, path, module_id_cache)
        default, self._env = self._env, env
        try:
            return DistributedModelParallel._shard_modules_impl(self, module, path, module_id_cache)
        finally:
            self._env = default

    def _assign_shards(self) -> None:
        """Give every context the local shards of its modules; the default gets the rest."""
        taken: set[int] = set()
        for ctx in self._contexts[1:]:
            ctx.shards = [
                s
                for path in ctx.paths
                for s in collect_shard_states(self.module.get_submodule(path))
            ]
            taken.update(id(s.kernel) for s in ctx.shards)
        self._contexts[0].shards = [
            s for s in collect_shard_states(self) if id(s.kernel) not in taken
        ]
        self._shards: list[ShardState] = [s for c in self._contexts for s in c.shards]

    @property
    def device_mesh(self) -> DeviceMesh:
        return self._default.device_mesh

    @property
    def shard_states(self) -> list[ShardState]:
        """Live views of this rank's embedding shards (every context) and their fused state.

        Under FULLY_SHARDED the views hold no storage between steps: read or write them only
        inside ``sparse2d.sync.fully_sharded.materialized(model)``.
        """
        return self._shards

    @property
    def fully_sharded(self) -> FullyShardedEmbeddings | None:
        """The FULLY_SHARDED machinery (``None`` without a FULLY_SHARDED context with replicas)."""
        return self._fully_sharded

    def extra_repr(self) -> str:
        sizes = ", ".join(f"{c.name}: L={c.sharding_group_size}" for c in self._contexts[1:])
        return (
            f"sharding_group_size={self.sharding_group_size}, num_replicas={self.num_replicas}, "
            f"replica_layout={self.replica_layout!r}" + (f", submodules=({sizes})" if sizes else "")
        )

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError(
            "DMPCollection holds process groups and cannot be pickled; save state_dict()."
        )
