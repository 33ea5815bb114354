"""``DMPCollection``: TorchRec's ``DistributedModelParallel`` over one sharding group, replicated.

Construction is one straight line in ``__init__`` and ``_build``, each step once with one log
line: validate (``collection_setup``), L and layout (``_choose_group_size``, overridden by the
public class for ``"auto"``), plan and mesh (``collection_setup.Setup``), shard (TorchRec's DMP
with ``ShardingEnv2D``), sync policy (docs/architecture.md walks it). Each module type of
``submodule_configs`` gets its own context; collaborators never hold the model.

A subclass of TorchRec's ``DMPCollection`` because TorchRec's train pipelines call
``model.sync()`` only on an instance of it. TorchRec's constructor (CUDA-only, its own groups)
is never run, and every method of it reachable after construction is overridden here;
``tests/test_core_call_forms.py`` checks that surface for the installed TorchRec.
"""

from __future__ import annotations

import contextlib
import logging
import os
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any, overload

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torchrec.distributed.model_parallel import DataParallelWrapper, DistributedModelParallel
from torchrec.distributed.model_parallel import DMPCollection as TorchRecDMPCollection
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.types import (
    DMPCollectionConfig,
    ModuleSharder,
    ShardedModule,
    ShardingPlan,
    ShardingStrategy,
)

from sparse2d.core.call_forms import adapt_set_all_reduce_hook
from sparse2d.core.collection_setup import Setup, choose_layout, fixed_group_size, resolve_setup
from sparse2d.core.construction import ConstructionReport
from sparse2d.core.contexts import (
    DefaultContextAttr,
    ShardingContext,
    assign_shards,
    describe_layout,
    geometry_repr,
    remapped_plan,
    sharding_env,
)
from sparse2d.core.fully_sharded import FullyShardedEmbeddings
from sparse2d.core.fully_sharded.surfaces import (
    GuardedOptimizer,
    SurfaceGuard,
    slice_fully_sharded,
)
from sparse2d.core.group_refs import ClosedGroup, drop_references
from sparse2d.core.pipeline_guard import before_early_lookup
from sparse2d.core.replica_repair import repair_from_replicas
from sparse2d.core.resources import GroupRecorder, Resources
from sparse2d.managed_collision import mc_identity_buffers, mc_sync_for, plain_shards
from sparse2d.patches import apply_all
from sparse2d.patches.torchrec_comm import forget_destroyed_groups
from sparse2d.patches.torchrec_train_pipelines import add_early_lookup_hook
from sparse2d.planner.plan_store import PlanStore
from sparse2d.sync.collectives import broadcast_
from sparse2d.sync.options import SyncOptions, SyncReport, merge_reports
from sparse2d.sync.policy import SyncPolicy
from sparse2d.sync.shards import ShardState, live_tensors

logger = logging.getLogger(__name__)
FS = ShardingStrategy.FULLY_SHARDED


def _log_step(number: int, name: str, detail: str) -> None:
    logger.info("[sparse2d] construction %d/6 %s: %s", number, name, detail)


def _describe_meshes(contexts: list[ShardingContext]) -> str:
    return ", ".join(
        f"{c.name}: sharding group {c.sharding_group}, replica group {c.replica_group}"
        for c in contexts
    )


def _describe_plans(report: ConstructionReport) -> str:
    return ", ".join(f"{name} (plan store: {p['cache']})" for name, p in report.plans.items())


class DMPCollection(TorchRecDMPCollection):
    """Shard embedding tables over groups of ``sharding_group_size`` ranks; replicate the groups.

    Two call forms (``sparse2d.core.call_forms``): ``DMPCollection(module, L, *, device=..., ...)``
    and TorchRec's unchanged call, positional or keyword (the second overload below).

    Args:
        module: model holding TorchRec ``EmbeddingBagCollection``/``EmbeddingCollection``
            modules; may live on ``meta``. Give the embedding optimizer the TorchRec way
            (``apply_optimizer_in_backward``) or through sharder ``fused_params``.
        sharding_group_size: ranks per sharding group ``L``; must divide the world size
            (``"auto"`` is the public ``sparse2d.DMPCollection``'s: the advisor chooses).
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
            ``sparse2d.core.fully_sharded``). Also per ``submodule_configs`` entry.
        node_group_size: ranks of one group sharing a host, for TWRW/grid (divides ``L``).
        custom_all_reduce: TorchRec's ``hook(tensors)`` (1.8.0 and 1.9.2), replacing the
            averaging all-reduce; the hook owns its process group (see
            ``call_forms.adapt_custom_all_reduce``).
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
        sharding_group_size: int,
        *,
        device: torch.device | str | None = None,
        plan: ShardingPlan | None = None,
        constraints: dict[str, ParameterConstraints] | None = None,
        sharders: list[ModuleSharder[nn.Module]] | None = None,
        replica_layout: str | None = None,
        global_pg: dist.ProcessGroup | None = None,
        node_group_size: int | None = None,
        custom_all_reduce: Callable[[list[torch.Tensor]], None] | None = None,
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
        data_parallel_wrapper: DataParallelWrapper | None = None,
        use_inter_host_allreduce: bool = False,
        custom_all_reduce: Callable[..., None] | None = None,
        submodule_configs: list[DMPCollectionConfig] | None = None,
        rs_awaitable_hook_module: str | None = None,
        use_sharded_relay: bool = False,
    ) -> None: ...

    def __init__(self, module: nn.Module, *args: Any, **kwargs: Any) -> None:
        """The construction, one straight line (module docstring). Steps 1-2 are pure (but
        ``"auto"``'s advice): a bad call raises the same error on every rank before the first
        collective. Steps 3-6 are collective; every process group they create is released by
        ``close``, and by a failed construction."""
        setup = resolve_setup(module, args, kwargs)
        _log_step(1, "validate", f"world {setup.world_size}, device {setup.device}")
        contexts = choose_layout(module, setup, self._choose_group_size(module, setup))
        _log_step(2, "L and layout", describe_layout(contexts, setup.world_size))
        self._resources = Resources("DMPCollection")
        groups = self._groups = GroupRecorder(on_destroyed=forget_destroyed_groups)
        # A model dropped without close() still releases its groups when it is collected;
        # the finalizer holds the groups only, never the model.
        release_groups = weakref.finalize(self, groups.destroy)
        release_groups.atexit = False  # at interpreter exit the process takes them down
        self._resources.callback(release_groups)
        try:
            with groups.recording():
                self._build(module, setup, contexts)
        except BaseException:
            self._resources.close()  # a failed construction leaves no group behind
            raise

    def _choose_group_size(self, module: nn.Module, setup: Setup) -> int:
        """Step 2's ``L``: the call's ``int``. The public ``sparse2d.DMPCollection`` overrides
        this for ``"auto"`` (the advisor's choice); the core never imports the advisor."""
        return fixed_group_size(setup)

    def _build(self, module: nn.Module, setup: Setup, contexts: list[ShardingContext]) -> None:
        """Steps 3-6: plan, mesh, shard, sync policy."""
        report = self.construction = ConstructionReport()
        setup.plan(module, contexts, report)
        _log_step(3, "plan", _describe_plans(report))
        setup.mesh(contexts, report)
        _log_step(4, "mesh", _describe_meshes(contexts))
        self._shard(module, setup, contexts, report)
        _log_step(5, "shard", f"{len(self._shards)} local shards")
        self._build_sync_policy(setup, contexts, report)
        _log_step(
            6, "sync policy", "replicas aligned" + (", slices kept" if self.fully_sharded else "")
        )

    def _shard(
        self,
        module: nn.Module,
        setup: Setup,
        contexts: list[ShardingContext],
        report: ConstructionReport,
    ) -> None:
        """Step 5: TorchRec's DMP, each module type with its context's ``ShardingEnv2D``."""
        apply_all(setup.device)  # workarounds this device still needs (sparse2d.patches)
        add_early_lookup_hook(before_early_lookup)  # TorchRec pipelines that look ahead
        self._envs_by_type = {c.module_type: sharding_env(c, setup.pg) for c in contexts}
        call = setup.call
        with report.phase("shard"):
            DistributedModelParallel.__init__(
                self,
                module,
                env=self._envs_by_type[None],
                device=setup.device,
                plan=remapped_plan(contexts, setup.device),
                sharders=setup.sharders,
                init_data_parallel=call.init_data_parallel,
                init_parameters=call.init_parameters,
                data_parallel_wrapper=call.data_parallel_wrapper,
            )
        self._contexts = contexts
        self._shards = assign_shards(contexts, self)

    def _build_sync_policy(
        self, setup: Setup, contexts: list[ShardingContext], report: ConstructionReport
    ) -> None:
        """Step 6: the replica sync; replicas aligned (TorchRec seeds each group's shards
        independently); FULLY_SHARDED contexts keep this replica's 1/G slice."""
        sliced = [c for c in contexts if c.strategy == FS and c.num_replicas > 1]
        # FULLY_SHARDED contexts are averaged by every step's reduce-scatter: their policy
        # syncs nothing.
        self._policies: list[SyncPolicy] = []
        for ctx in contexts:
            mc = mc_sync_for(self, ctx.shards, ctx.replica_pg) if setup.has_mc else None
            ctx.policy = SyncPolicy(
                [] if ctx in sliced else plain_shards(ctx.shards, mc),
                ctx.replica_pg,
                ctx.num_replicas,
                setup.call.sync_options,
                setup.hook,
                global_pg=setup.pg,
                mc=mc,
            )
            self._policies.append(ctx.policy)
        self._resources.callback(_closer(self._policies))
        self.fully_sharded: FullyShardedEmbeddings | None = None
        with report.phase("align"):
            self.align_replicas()
        self.fully_sharded = slice_fully_sharded(self, sliced, setup.pg, self._resources)
        finish = _finisher(self._policies, self._resources)
        self._guard = SurfaceGuard(self._resources, finish, self.fully_sharded)
        self._optim = GuardedOptimizer(self._optim, self._guard)

    # ---- lifetime ----------------------------------------------------------------------
    def close(self) -> None:
        """Release what this model created: sync hooks and transfers in flight, the
        FULLY_SHARDED hooks, and its process groups (the 2D mesh's, TorchRec's TWRW/grid
        groups; never ``global_pg`` or the default group). Local to the rank, no collective;
        a second call does nothing; forward/sync afterwards raise a clear error. The groups'
        threads and sockets end here, without a garbage collection
        (``sparse2d.core.group_refs``)."""
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
        if self.fully_sharded is not None:  # start the weight all-gathers before input dist
            self.fully_sharded.prefetch()
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

    # ---- replica consistency: the sync spine starts here (sparse2d.sync.policy) ------------
    def align_replicas(self, include_optimizer_state: bool = True) -> None:
        """Overwrite every replica's shards with replica-rank 0's copy (every context)."""
        self._resources.check_open("align replicas")
        for ctx in self._contexts:
            if ctx.num_replicas == 1:
                continue
            tensors = live_tensors(ctx.shards, weights=True, states=include_optimizer_state)
            tensors += mc_identity_buffers(ctx.policy)
            full = self.fully_sharded
            with full.gathered() if full else contextlib.nullcontext(), torch.no_grad():
                broadcast_(tensors, ctx.replica_pg, src_group_rank=0)
        for policy in self._policies:
            policy.reset()

    def sync(self, include_optimizer_state: bool = True) -> SyncReport:
        """Average embedding weights and all fused optimizer state over the replica group.

        Covers every context. Routed through the sync policy so its engine and hook
        apply; blocking, and it first lands any transfer still in flight from
        ``maybe_sync``. TorchRec's train pipelines call this every
        ``dmp_collection_sync_interval_batches`` batches. FULLY_SHARDED contexts were averaged
        by every step's reduce-scatter: for them the NaN/inf check runs here, and a custom
        all-reduce hook gets their full weights and states (TorchRec's semantics).
        """
        self._resources.check_open("sync")
        reports = [
            p.sync_now(include_optimizer_state=include_optimizer_state) for p in self._policies
        ]
        if self.fully_sharded is not None:
            reports.append(self.fully_sharded.report(-1))
            hook = self._policies[0].hook
            if hook is not None:  # TorchRec calls the hook under FULLY_SHARDED too
                reports.append(self.fully_sharded.run_hook(hook, include_optimizer_state))
        return merge_reports(reports)

    def maybe_sync(self, step: int) -> SyncReport | None:
        """Sync if the policy's cadence says step ``step`` (0-based) ends an interval.

        FULLY_SHARDED contexts report their step's reduce-scatters (and run the job-wide
        NaN/inf check) at every step.
        """
        self._resources.check_open("sync")
        reports = []
        for policy in self._policies:
            report = policy.step(step)
            if report is not None:
                reports.append(report)
        if self.fully_sharded is not None:
            report = self.fully_sharded.report(step)
            if report is not None:
                reports.append(report)
        if not reports:
            return None
        return reports[0] if len(reports) == 1 else merge_reports(reports)

    def finish_sync(self) -> None:
        """Land every sync still in flight (hidden or delayed), every context: the replicas
        then hold what a blocking sync would have left. Local waits, no new collective."""
        for policy in self._policies:
            policy.finish()

    def repair_from_replicas(self, ranks: list[int], include_dense: bool = True) -> None:
        """Refill ``ranks`` (e.g. restarted with fresh weights) from a healthy replica.

        Collective over the world: every rank calls it with the same ``ranks``. No storage is
        read; see ``sparse2d.core.replica_repair``.
        """
        self._resources.check_open("repair replicas")
        repair_from_replicas(self, ranks, include_dense)

    def set_all_reduce_hook(self, reduce_hook: Callable[..., None] | None) -> None:  # type: ignore[override]
        """Replace the averaging all-reduce with a hook called as the installed TorchRec calls
        it: 1.8.0's ``hook(tensors)`` (averages in place over a group it holds, e.g.
        ``model.replica_pg``), 1.9.2's ``hook(pg, tensors)`` (``pg``: the replica group).
        It replaces a constructor ``custom_all_reduce``; ``None`` restores the default."""
        hook = adapt_set_all_reduce_hook(reduce_hook)
        for policy in self._policies:
            policy.hook = hook

    def ensure_reduce_scatter_complete(self) -> None:
        """TorchRec's FULLY_SHARDED wait. Nothing to wait for: our FULLY_SHARDED lands its
        reduce-scatters at the end of each backward (see ``sparse2d.core.fully_sharded``)."""

    @property
    def sync_policies(self) -> list[SyncPolicy]:
        """Every context's sync policy, in context order (``maybe_sync``/``sync`` run them all)."""
        return list(self._policies)

    @property
    def sync_policy(self) -> SyncPolicy:
        """The default context's sync policy (``sync_policies`` lists every context's)."""
        return self._policies[0]

    @sync_policy.setter
    def sync_policy(self, policy: SyncPolicy) -> None:
        """Fault tolerance installs one policy that syncs every context (the in-world ones
        first): it replaces them all."""
        self._policies[:] = [policy]

    # ---- surfaces that hand out tensors (sparse2d.core.fully_sharded.surfaces) ---------
    def _before_surface(self, surface: str, land: bool = False) -> None:
        guard = self.__dict__.get("_guard")  # TorchRec's construction reads surfaces too
        if guard is not None:
            guard(surface, land)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self._before_surface("state_dict()", land=True)
        return super().state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
        """Load, then forget the sync references (momentum scaling, managed
        collision) taken from the old values. Call it on every rank, as every load."""
        self._before_surface("load_state_dict()", land=True)
        result = super().load_state_dict(state_dict, *args, **kwargs)
        for policy in self._policies:
            policy.reset()
        return result

    def named_parameters(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, nn.Parameter]]:
        self._before_surface("named_parameters()")
        return super().named_parameters(*args, **kwargs)

    def bare_named_parameters(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, Any]]:
        self._before_surface("bare_named_parameters()")
        return super().bare_named_parameters(*args, **kwargs)

    def named_buffers(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, torch.Tensor]]:
        self._before_surface("named_buffers()")
        return super().named_buffers(*args, **kwargs)

    # ---- geometry: the default context's (sparse2d.core.contexts) -----------
    @property
    def contexts(self) -> list[ShardingContext]:
        """The default context, then one per ``submodule_configs`` entry."""
        return list(self._contexts)

    device_mesh = DefaultContextAttr[DeviceMesh]("device_mesh")  # overrides TorchRec's
    sharding_pg = DefaultContextAttr[dist.ProcessGroup]("sharding_pg")
    replica_pg = DefaultContextAttr[dist.ProcessGroup]("replica_pg")
    sharding_group_size = DefaultContextAttr[int]("sharding_group_size")
    num_replicas = DefaultContextAttr[int]("num_replicas")
    replica_layout = DefaultContextAttr[str]("replica_layout")
    sharding_strategy = DefaultContextAttr[ShardingStrategy]("strategy")
    sharding_group = DefaultContextAttr[list[int]](
        "sharding_group", "Global ranks of this rank's sharding group."
    )
    replica_group = DefaultContextAttr[list[int]](
        "replica_group", "Global ranks holding the same shards as this rank."
    )

    group_plan = DefaultContextAttr[ShardingPlan](
        "plan", "The default context's plan as made for ranks ``0..L-1`` (before remapping)."
    )

    @property
    def shard_states(self) -> list[ShardState]:
        """Live views of this rank's embedding shards (every context) and their fused state.

        Under FULLY_SHARDED the views hold no storage between steps: read or write them only
        inside ``sparse2d.core.fully_sharded.materialized(model)``.
        """
        return self._shards

    def extra_repr(self) -> str:
        return geometry_repr(self._contexts)

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError(
            "DMPCollection holds process groups and cannot be pickled; save state_dict()."
        )


def _closer(policies: list[SyncPolicy]) -> Callable[[], None]:
    """``close`` of every policy the model holds (fault tolerance may replace them)."""

    def close() -> None:
        for policy in policies:
            policy.close()

    return close


def _finisher(policies: list[SyncPolicy], resources: Resources) -> Callable[[], None]:
    """What a surface runs before it hands out tensors: land every sync in flight, unless
    the model is closed. Holds the policies, never the model (no reference cycle)."""

    def finish() -> None:
        if not resources.closed:
            for policy in policies:
                policy.finish()

    return finish
