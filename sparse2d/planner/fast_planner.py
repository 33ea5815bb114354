"""TorchRec's planner, configured to plan one 2D sharding group in seconds at ``L=256``.

``EmbeddingShardingPlanner``'s defaults run four proposers (grid search, two greedy walks,
uniform) that together make hundreds of proposals for a group of 64 ranks and 64 tables;
its ``GreedyPerfPartitioner`` deep-copies every proposal and, for table-row-wise and grid
options, the whole device list per option. At 1,024 ranks (``L=64``) that was ~40-60 s of
one core, at 4,096 (``L=256``, 128 tables) ~395 s. The proposals that decide the plan are
few: each table's fastest option (``GreedyProposer``'s first proposal, by the deepest shard
and by the sum over shards) and one plan per sharding type (``UniformProposer``). The greedy
walks stop once their plans stop improving (``threshold=1``) instead of walking every
option; while proposals do not fit memory they keep walking as before, so a model that
only fits with its larger tables row-wise still gets that plan. The grid-search proposer
is dropped. Planning statistics (a large table logged per plan) are off.

Past the proposals, the enumerator's estimates dominate (at ``L=256`` TorchRec's estimator
ran 66k times, once per shard of every option of every table, ~140 s of one core).
Identical tables (shape, dtype, features, constraints, optimizer) get identical estimates,
so ``SharedEstimateEnumerator`` estimates one table of each kind and copies its shards'
perf and storage to the others (``tests/test_planner_fast.py`` checks the copies equal
TorchRec's own estimates).

With fewer tables than ranks (128 tables on a group of 256), every option TorchRec offers
a 32-wide table is one shard (its column-wise shards are at least 128 wide by default), so
half the group holds a table and half holds nothing: twice total / L bytes on the busy
ranks, and a replica sync as long as theirs. ``spread_constraints`` lets such tables split
into narrower column shards (``min_partition``), enough for every rank to get one; TorchRec's
own perf model then rates the column-wise plan faster than the table-wise one (half the
lookup work per rank) and picks it. Tables the caller constrained are left as given.

When a proposal does not fit, the greedy walks move one table at a time to its next option,
and each failed proposal costs the planner about a second at ``L=256`` (partitioning, and
hashing and summing every shard). Groups whose row-wise options carry large output buffers
(4,096 ranks in groups of 256, a batch of 4,096: 512 MiB per table on every rank) failed 550
of 558 proposals (~500 s). ``FitCheckedProposer`` answers a proposal whose shards need more
storage than the group can give them (row-wise shards summed on their ranks, the rest
against the room left) as the planner would (not partitionable) without handing it to the
planner: such a proposal can never be placed, so the walk, and the plan it ends with, are
unchanged; only the proposals that may fit are partitioned.

The plan is still TorchRec's: same enumerator, estimators, storage reservation,
partitioner and perf rating; only fewer candidates are rated. ``tests/test_planner_fast.py``
checks its per-rank perf and memory balance against TorchRec's defaults.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import torch.nn as nn
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology, enumerators
from torchrec.distributed.planner.constants import BATCH_SIZE
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.proposers import GreedyProposer, UniformProposer
from torchrec.distributed.planner.stats import NoopEmbeddingStats
from torchrec.distributed.planner.types import (
    Enumerator,
    ParameterConstraints,
    PartitionByType,
    Proposer,
    ShardingOption,
)
from torchrec.distributed.types import ModuleSharder


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


class SharedEstimateEnumerator(EmbeddingEnumerator):
    """TorchRec's ``EmbeddingEnumerator`` estimating each kind of table once, without the
    search-space cache: ``enumerate`` deep-copied every option of every table into it (at
    832 tables and ``L=256``, 30 of the plan's 43 s) for a second call with the same module,
    which a group's planning never makes."""

    def enumerate(
        self, module: nn.Module, sharders: list[ModuleSharder[nn.Module]]
    ) -> list[ShardingOption]:
        self._last_stored_module = None  # never answer from a cache
        enumerators.copy = _NoSearchSpaceCopy  # type: ignore[assignment]
        try:
            return super().enumerate(module, sharders)
        finally:
            enumerators.copy = copy  # type: ignore[assignment]
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
        for option, source in copies:
            for shard, done in zip(option.shards, source.shards, strict=True):
                shard.perf = _clone(done.perf)
                shard.storage = _clone(done.storage)

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

    def __init__(self, inner: Proposer) -> None:
        self.inner = inner
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
        self._shards = {id(o): _shard_storage(o) for o in search_space}

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
    return EmbeddingShardingPlanner(
        topology=topology,
        batch_size=batch,
        enumerator=SharedEstimateEnumerator(topology, batch, constraints),
        constraints=constraints,
        proposer=[
            FitCheckedProposer(GreedyProposer(threshold=1)),
            FitCheckedProposer(GreedyProposer(use_depth=False, threshold=1)),
            FitCheckedProposer(UniformProposer()),
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
