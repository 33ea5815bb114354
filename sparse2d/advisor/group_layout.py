"""Where every shard lands inside one sharding group of ``L`` ranks: the launch's own plan.

A group's layout depends on ``L`` (and on how many of its ranks share a host), never on
the number of groups, so it is computed once per ``L`` and cached. It is made by the
planning path ``DMPCollection`` itself uses (``sparse2d.planner.group_plan.plan_on_topology``:
``spread_constraints`` and ``fast_planner.group_planner``) on a meta-device model and a
``Topology`` of ``L`` devices, with no process group, so the advice prices the plan a launch
builds, never one it would not. Memory caps are lifted (the cost model judges the fit
against the real device memory); each shard keeps TorchRec's perf and storage estimates.
"""

from __future__ import annotations

import contextlib
import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sparse2d.advisor.workload import TableLoad, Workload
from sparse2d.errors import PlanError

PROPOSAL = "planner"
"""The one layout per ``L``: the plan ``DMPCollection`` would build."""


@dataclass(frozen=True, slots=True)
class PlacedShard:
    """One shard of one table on one rank of the group (ranks ``0..L-1``)."""

    table: str
    sharding_type: str
    rank: int
    rows: int
    cols: int
    io_bytes: int
    """TorchRec's estimate of the shard's input/output buffers (grows with ``L``)."""
    count: int = 1
    """Identical shards of identical tables on this rank (row-wise tables share placement)."""


@dataclass(frozen=True, slots=True)
class GroupLayout:
    """A plan for one group of ``group_size`` ranks."""

    group_size: int
    proposal: str
    shards: tuple[PlacedShard, ...]

    def per_rank(self) -> list[list[PlacedShard]]:
        ranks: list[list[PlacedShard]] = [[] for _ in range(self.group_size)]
        for shard in self.shards:
            ranks[shard.rank].append(shard)
        return ranks


class GroupLayoutPlanner(ABC):
    """Makes the candidate layouts of one sharding group (no process group needed)."""

    @abstractmethod
    def layouts(
        self, workload: Workload, group_size: int, host_ranks: int, compute_device: str
    ) -> list[GroupLayout]:
        """Candidate layouts for ``group_size`` ranks, ``host_ranks`` of which share a host."""


@contextlib.contextmanager
def _quiet_torchrec() -> Iterator[None]:
    """TorchRec's planner warns about dry-run topologies on every call; that is our use."""
    names = ("torchrec.distributed.planner", "torchrec.distributed.planner.types")
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _table_key(t: TableLoad) -> tuple[object, ...]:
    return (t.rows, t.dim, t.features, t.pooling_factor, t.sharding)


class TorchRecGroupPlanner(GroupLayoutPlanner):
    """TorchRec enumerator + estimators + ``GreedyPerfPartitioner`` on a meta model."""

    def __init__(self) -> None:
        self._cache: dict[tuple[object, ...], list[GroupLayout]] = {}
        self._modules: dict[tuple[object, ...], tuple[Any, dict[str, Any]]] = {}

    def layouts(
        self, workload: Workload, group_size: int, host_ranks: int, compute_device: str
    ) -> list[GroupLayout]:
        local = math.gcd(group_size, max(1, host_ranks))
        tables = tuple(_table_key(t) + (t.name,) for t in workload.tables)
        key = (tables, workload.batch_size_per_rank, group_size, local, compute_device)
        if key not in self._cache:
            if tables not in self._modules:  # one meta model for every L (the planner reads it)
                self._modules[tables] = _meta_model(workload)
            module, constraints = self._modules[tables]
            with _quiet_torchrec():
                placed = _plan_like_a_launch(
                    module, constraints, workload, group_size, local, compute_device
                )
            if not placed:
                raise PlanError(
                    f"the planner placed no tables at {group_size} ranks (this TorchRec's "
                    "planner keeps no placed options); the advisor cannot price the plan."
                )
            counts = {t.name: 1 for t in workload.tables}
            shards = tuple(_shards(placed, workload, counts))
            self._cache[key] = [GroupLayout(group_size, PROPOSAL, shards)]
        return self._cache[key]


def _meta_model(workload: Workload) -> tuple[Any, dict[str, Any]]:
    """The workload's tables as an ``EmbeddingBagCollection`` on meta, and their constraints."""
    import torch
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    from sparse2d.planner.sharders import MODEL_PARALLEL_TYPES

    configs, constraints = [], {}
    for t in workload.tables:
        configs.append(
            EmbeddingBagConfig(
                name=t.name,
                embedding_dim=t.dim,
                num_embeddings=t.rows,
                feature_names=[f"{t.name}_f{j}" for j in range(t.features)],
            )
        )
        constraints[t.name] = ParameterConstraints(
            sharding_types=[t.sharding] if t.sharding else list(MODEL_PARALLEL_TYPES),
            compute_kernels=["fused"],
            pooling_factors=[t.pooling_factor] * t.features,
        )
    return EmbeddingBagCollection(tables=configs, device=torch.device("meta")), constraints


def _plan_like_a_launch(
    module: Any,
    constraints: dict[str, Any],
    workload: Workload,
    group_size: int,
    local: int,
    compute_device: str,
) -> list[Any]:
    """The placed options of the plan ``DMPCollection``'s planning path makes for
    ``group_size`` ranks (``plan_on_topology``: same constraints spreading, enumerator,
    proposers, partitioner). Memory caps are lifted so every ``L`` gets a plan the cost model
    can price and judge against the real device memory; where the launch's own caps
    (TorchRec's defaults) do not bind, the plans are the same. (Planning under the launch's
    caps first made ``sparse2d plan`` on configs/dlrm_large_1024gpu.yaml take 724 s instead
    of ~90 s: TorchRec's proposers walk long before they give up on an ``L`` that cannot fit.)"""
    from torchrec.distributed.planner import Topology

    from sparse2d.planner.group_plan import plan_on_topology
    from sparse2d.planner.sharders import default_sharders

    huge = 2**60
    topology = Topology(
        world_size=group_size,
        compute_device=compute_device,
        local_world_size=local,
        hbm_cap=huge if compute_device == "cuda" else None,
        ddr_cap=huge,
    )
    batch = workload.batch_size_per_rank
    try:
        return plan_on_topology(module, topology, default_sharders(), constraints, batch)[1]
    except Exception as error:  # TorchRec's PlannerError, as one line naming the group
        raise PlanError(
            f"the planner could not place the tables at {group_size} ranks: {error}"
        ) from None


def _shards(placed: list[Any], workload: Workload, counts: dict[str, int]) -> Iterator[PlacedShard]:
    eb = workload.element_bytes
    for option in placed:
        for s in option.shards:  # type: ignore[attr-defined]
            rows, cols = int(s.size[0]), int(s.size[1])
            total = int(s.storage.hbm + s.storage.ddr)
            yield PlacedShard(
                table=option.name,  # type: ignore[attr-defined]
                sharding_type=option.sharding_type,  # type: ignore[attr-defined]
                rank=int(s.rank),
                rows=rows,
                cols=cols,
                io_bytes=max(0, total - rows * cols * eb),
                count=counts[option.name],
            )
