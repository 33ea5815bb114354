"""TorchRec's planner, configured to plan one 2D sharding group in seconds at ``L=256``.

Same enumerator, estimators, storage reservation, partitioner and perf rating as TorchRec's
``EmbeddingShardingPlanner``; only fewer candidates are rated: few proposals, one estimate
per kind of identical table, proposals that cannot fit answered without partitioning, a
structural copy of the best plan, and column splits when there are fewer tables than ranks.
Where the time went and what each change saves: docs/training.md, "Start-up at scale".
"""

from __future__ import annotations

import copy
import gc
import math
from typing import Any

import numpy as np
import torch.nn as nn
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology, enumerators, planners
from torchrec.distributed.planner.constants import BATCH_SIZE
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.proposers import GreedyProposer, UniformProposer
from torchrec.distributed.planner.stats import NoopEmbeddingStats
from torchrec.distributed.planner.types import (
    Enumerator,
    ParameterConstraints,
    PartitionByType,
    Proposer,
    Shard,
    ShardingOption,
)
from torchrec.distributed.sharding_plan import (
    calculate_shard_sizes_and_offsets as _shard_sizes_and_offsets,
)
from torchrec.distributed.types import ModuleSharder, ShardingPlan


def _clone(value: Any) -> Any:
    """A shallow copy of a plain-attribute object (TorchRec's ``Perf``/``Storage``); at
    ``L=1024`` and 832 tables ``copy.copy`` of 660k of them took 17 s, this a fraction."""
    if not hasattr(value, "__dict__"):
        return copy.copy(value)
    out = object.__new__(type(value))
    out.__dict__.update(value.__dict__)
    return out


class _NoSearchSpaceCopy:
    """Stands in for the ``copy`` module inside TorchRec's enumerator while it runs: the
    option list it deep-copies into its search-space cache is passed through uncopied (the
    cache is dropped right after), every other deep copy is real."""

    @staticmethod
    def deepcopy(value: Any, memo: Any = None) -> Any:
        return value if isinstance(value, list) else copy.deepcopy(value, memo)


_ATOMIC = (str, int, float, bool, type(None))


def copy_plan(options: list[ShardingOption], memo: Any = None) -> list[ShardingOption]:
    """``copy.deepcopy`` of a list of options, made structurally: each option and shard anew,
    the shards' size and offset lists and perf and storage estimates copied (flat objects of
    numbers), the tensor and module shared (as ``ShardingOption.__deepcopy__`` does) and every
    other attribute deep-copied."""
    memo = {} if memo is None else memo
    out = []
    for option in options:
        clone = object.__new__(type(option))
        for key, value in option.__dict__.items():
            if key in ("_tensor", "_module"):
                setattr(clone, key, value)
            elif key == "shards":
                setattr(clone, key, [_copy_shard(s) for s in value])
            elif type(value) in _ATOMIC:  # what deepcopy returns as is
                setattr(clone, key, value)
            else:
                setattr(clone, key, copy.deepcopy(value, memo))
        out.append(clone)
    return out


def _copy_shard(shard: Shard) -> Shard:
    clone = _clone(shard)
    clone.size, clone.offset = list(shard.size), list(shard.offset)
    if shard.storage is not None:
        clone.storage = _clone(shard.storage)
    if shard.perf is not None:
        clone.perf = _clone(shard.perf)
    return clone


class _PlanCopy:
    """Stands in for the ``copy`` module inside TorchRec's planner while it plans: a list of
    sharding options is copied by ``copy_plan``, anything else as ``copy`` would."""

    copy = staticmethod(copy.copy)

    @staticmethod
    def deepcopy(value: Any, memo: Any = None) -> Any:
        if isinstance(value, list) and all(isinstance(o, ShardingOption) for o in value):
            return copy_plan(value, memo)
        return copy.deepcopy(value, memo)


class GroupShardingPlanner(EmbeddingShardingPlanner):
    """TorchRec's ``EmbeddingShardingPlanner`` whose copies of its best plan so far are made
    by ``copy_plan`` (see the module docstring), planning with Python's cyclic garbage
    collector paused: a plan allocates millions of small objects (a shard, its size and
    offset lists, per rank of every row-wise option) and each burst made the collector walk
    them all again, a third of the CPU time at ``L=4096``. Reference counting still frees
    them; the collector's state is restored after."""

    def plan(self, module: nn.Module, sharders: list[ModuleSharder[nn.Module]]) -> ShardingPlan:
        collecting = gc.isenabled()
        gc.disable()
        planners.copy = _PlanCopy  # type: ignore[assignment]
        try:
            return super().plan(module, sharders)
        finally:
            planners.copy = copy  # type: ignore[assignment]
            if collecting:
                gc.enable()


class _SameShapeShardSizes:
    """TorchRec's ``calculate_shard_sizes_and_offsets``, computed once per table shape and
    sharding (it reads only the tensor's shape, TorchRec 1.8): each call gets its own lists. At ``L=4096``
    the row-wise split of one table took ~5 ms, once per table."""

    def __init__(self) -> None:
        self._done: dict[tuple[Any, ...], tuple[list[list[int]], list[list[int]]]] = {}

    def __call__(
        self,
        tensor: Any,
        world_size: int,
        local_world_size: int,
        sharding_type: str,
        col_wise_shard_dim: int | None = None,
        device_memory_sizes: list[int] | None = None,
        num_buckets: int | None = None,
    ) -> tuple[list[list[int]], list[list[int]]]:
        key = (
            tuple(tensor.shape),
            world_size,
            local_world_size,
            sharding_type,
            col_wise_shard_dim,
            None if device_memory_sizes is None else tuple(device_memory_sizes),
            num_buckets,
        )
        if key not in self._done:
            self._done[key] = _shard_sizes_and_offsets(
                tensor=tensor,
                world_size=world_size,
                local_world_size=local_world_size,
                sharding_type=sharding_type,
                col_wise_shard_dim=col_wise_shard_dim,
                device_memory_sizes=device_memory_sizes,
                num_buckets=num_buckets,
            )
        sizes, offsets = self._done[key]
        return [list(x) for x in sizes], [list(x) for x in offsets]


class SharedEstimateEnumerator(EmbeddingEnumerator):
    """TorchRec's ``EmbeddingEnumerator`` estimating each kind of table once, without the
    search-space cache: ``enumerate`` deep-copied every option of every table into it (at
    832 tables and ``L=256``, 30 of the plan's 43 s) for a second call with the same module,
    which a group's planning never makes. Shard sizes are split once per table shape
    (``_SameShapeShardSizes``)."""

    def enumerate(
        self, module: nn.Module, sharders: list[ModuleSharder[nn.Module]]
    ) -> list[ShardingOption]:
        self._last_stored_module = None  # never answer from a cache
        enumerators.copy = _NoSearchSpaceCopy  # type: ignore[assignment]
        enumerators.calculate_shard_sizes_and_offsets = _SameShapeShardSizes()  # type: ignore[assignment]
        try:
            return super().enumerate(module, sharders)
        finally:
            enumerators.copy = copy  # type: ignore[assignment]
            enumerators.calculate_shard_sizes_and_offsets = _shard_sizes_and_offsets
            self._last_stored_module = self._last_stored_search_space = None

    def populate_estimates(self, sharding_options: list[ShardingOption]) -> None:
        first: dict[tuple[Any, ...], ShardingOption] = {}
        copies: list[tuple[ShardingOption, ShardingOption]] = []
        for option in sharding_options:
            key = self._kind(option)
            if key in first:
                copies.append((option, first[key]))
            else:
                first[key] = option
        super().populate_estimates(list(first.values()))
        for option, source in copies:  # TorchRec replaces estimates, never edits one in place
            for shard, done in zip(option.shards, source.shards, strict=True):
                shard.perf, shard.storage = done.perf, done.storage

    def _kind(self, o: ShardingOption) -> tuple[Any, ...]:
        """Everything TorchRec's estimators read of one option, except the table's name."""
        tensor = o.tensor
        return (
            id(o.module[1]),
            tuple(tensor.shape),
            tensor.dtype,
            repr(getattr(tensor, "_optimizer_classes", None)),
            repr(getattr(tensor, "_optimizer_kwargs", None)),
            o.sharding_type,
            o.compute_kernel,
            tuple(o.input_lengths),
            o.batch_size,
            o.is_pooled,
            len(o.feature_names or []) if o.feature_names is not None else None,
            repr((o.cache_params, o.enforce_hbm, o.stochastic_rounding, o.bounds_check_mode)),
            repr((o.output_dtype, o.key_value_params, o.dependency)),
            tuple((tuple(s.size), tuple(s.offset)) for s in o.shards),
            repr((self._constraints or {}).get(o.name)),
        )


class FitCheckedProposer(Proposer):
    """``inner``, with its proposals that cannot fit the group's storage answered here.

    The planner passes the reserved per-rank storage with each feedback; from the first on,
    a proposal that ``_may_fit`` rejects is fed back to ``inner`` as not partitionable (what
    the partitioner would have said) and the next one is taken, so the planner partitions
    and hashes only proposals that may fit.
    """

    def __init__(self, inner: Proposer, storage: ShardStorage | None = None) -> None:
        self.inner = inner
        self.storage = storage or ShardStorage()
        """Each option's shard storage, shared by the proposers of one planner."""
        self.skipped = 0
        """Proposals answered here in the last ``plan`` (never partitioned)."""
        self._constraint: Topology | None = None
        self._capacity: np.ndarray | None = None
        self._shards: dict[int, tuple[bool, np.ndarray]] = {}

    def load(
        self, search_space: list[ShardingOption], enumerator: Enumerator | None = None
    ) -> None:
        self.inner.load(search_space, enumerator)
        self.skipped, self._constraint, self._capacity = 0, None, None
        self._shards = {id(o): self.storage(o) for o in search_space}

    def propose(self) -> list[ShardingOption] | None:
        proposal = self.inner.propose()
        while proposal and self._capacity is not None and not self._may_fit(proposal):
            self.skipped += 1
            self.inner.feedback(
                partitionable=False, plan=proposal, storage_constraint=self._constraint
            )
            proposal = self.inner.propose()
        return proposal

    def feedback(
        self,
        partitionable: bool,
        plan: list[ShardingOption] | None = None,
        perf_rating: float | None = None,
        storage_constraint: Topology | None = None,
    ) -> None:
        if storage_constraint is not None and storage_constraint is not self._constraint:
            self._constraint = storage_constraint
            self._capacity = np.array(
                [[d.storage.hbm, d.storage.ddr, d.storage.ssd] for d in storage_constraint.devices],
                dtype=np.float64,
            )
        self.inner.feedback(partitionable, plan, perf_rating, storage_constraint)

    def _may_fit(self, proposal: list[ShardingOption]) -> bool:
        """False only when TorchRec's partitioner cannot place ``proposal``: its uniform
        (row-wise, data-parallel) options put shard ``i`` on rank ``i``, so their sum must
        fit each rank; every other shard needs a rank with room left for it, and all of
        them together need the room left on all ranks."""
        capacity = self._capacity
        if capacity is None:
            return True
        left = capacity.copy()
        rest: list[np.ndarray] = []
        for option in proposal:
            uniform, shards = self._shards.get(id(option)) or _shard_storage(option)
            if uniform and len(shards) == len(left):
                left -= shards
            else:
                rest.append(shards)
        if (left < 0).any():
            return False
        if not rest:
            return True
        others = np.concatenate(rest)
        return bool(
            (others <= left.max(axis=0)).all() and (others.sum(axis=0) <= left.sum(axis=0)).all()
        )


class ShardStorage:
    """``_shard_storage`` of each option, computed once for all the proposers that load the
    same search space (each option is kept with its entry, so an id is never reused)."""

    def __init__(self) -> None:
        self._done: dict[int, tuple[ShardingOption, tuple[bool, np.ndarray]]] = {}

    def __call__(self, option: ShardingOption) -> tuple[bool, np.ndarray]:
        hit = self._done.get(id(option))
        if hit is None or hit[0] is not option:
            hit = self._done[id(option)] = (option, _shard_storage(option))
        return hit[1]


def _shard_storage(option: ShardingOption) -> tuple[bool, np.ndarray]:
    """(placed uniformly, each shard's ``[hbm, ddr, ssd]`` bytes)."""
    rows = [[s.storage.hbm, s.storage.ddr, s.storage.ssd] for s in option.shards if s.storage]
    shards = np.array(rows, dtype=np.float64).reshape(-1, 3)
    return option.partition_by == PartitionByType.UNIFORM.value, shards


def group_planner(
    topology: Topology,
    batch_size: int | None,
    constraints: dict[str, ParameterConstraints] | None,
) -> EmbeddingShardingPlanner:
    """The planner ``DMPCollection`` uses for one sharding group of ``topology.world_size``."""
    batch = batch_size if batch_size is not None else BATCH_SIZE
    storage = ShardStorage()
    return GroupShardingPlanner(
        topology=topology,
        batch_size=batch,
        enumerator=SharedEstimateEnumerator(topology, batch, constraints),
        constraints=constraints,
        proposer=[
            FitCheckedProposer(GreedyProposer(threshold=1), storage),
            FitCheckedProposer(GreedyProposer(use_depth=False, threshold=1), storage),
            FitCheckedProposer(UniformProposer(), storage),
        ],
        stats=NoopEmbeddingStats(),
        debug=False,
    )


def spread_constraints(
    module: nn.Module, group_size: int, constraints: dict[str, ParameterConstraints] | None
) -> dict[str, ParameterConstraints] | None:
    """``constraints`` plus, when the module has fewer tables than ``group_size`` ranks, a
    ``min_partition`` for each unconstrained table narrow enough that its column shards can
    cover the group (widths stay multiples of 4, FBGEMM's alignment)."""
    dims: dict[str, int] = {}
    for sub in module.modules():
        for name in ("embedding_bag_configs", "embedding_configs"):
            getter = getattr(sub, name, None)
            if callable(getter):
                dims.update({c.name: c.embedding_dim for c in getter()})
                break
    if not dims or len(dims) >= group_size:
        return constraints
    pieces = math.ceil(group_size / len(dims))
    out = dict(constraints or {})
    for table, dim in dims.items():
        width = max(4, dim // pieces // 4 * 4)
        if table not in out and width < dim and dim % width == 0:
            out[table] = ParameterConstraints(min_partition=width)
    return out
