"""Where every shard lands inside one sharding group of ``L`` ranks: the launch's own plan.

A group's layout depends on ``L`` (and on how many of its ranks share a host), never on
the number of groups, so it is computed once per ``L`` and cached. It is made by the
planning path ``DMPCollection`` itself uses (``sparse2d.planner.group_plan.plan_on_topology``:
``spread_constraints`` and ``fast_planner.group_planner``) on a meta-device model and a
``Topology`` of ``L`` devices, with no process group, so the advice prices the plan a launch
builds, never one it would not. Memory caps are lifted (the cost model judges the fit
against the real device memory); each shard keeps TorchRec's perf and storage estimates.
One meta model serves every ``L`` (the planner only reads it).
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
from sparse2d.errors import ConfigError, PlanError

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

    def prepare(
        self, workload: Workload, groups: list[tuple[int, int]], compute_device: str
    ) -> None:
        """Make ahead the layouts ``layouts`` will be asked for, one per ``(group_size,
        host_ranks)`` (this default makes none: ``layouts`` makes each when asked)."""
        return None


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
    """TorchRec enumerator + estimators + ``GreedyPerfPartitioner`` on a meta model.

    ``workers > 1``: ``prepare`` plans the group sizes in that many forked processes, the
    largest first (each plan is single-threaded Python; at 4,096 ranks ``L=4096`` alone is a
    third of the work). The plans are the same as one process makes."""

    def __init__(self, workers: int = 1) -> None:
        if workers < 1:
            raise ConfigError(
                f"workers={workers} must be >= 1 (processes planning the candidate L; 1 = this one)"
            )
        self.workers = workers
        self._cache: dict[tuple[object, ...], list[GroupLayout]] = {}
        self._modules: dict[tuple[object, ...], tuple[Any, dict[str, Any]]] = {}

    def layouts(
        self, workload: Workload, group_size: int, host_ranks: int, compute_device: str
    ) -> list[GroupLayout]:
        key = self._key(workload, group_size, host_ranks, compute_device)
        if key not in self._cache:
            self._cache[key] = self._plan(workload, group_size, host_ranks, compute_device)
        return self._cache[key]

    def prepare(
        self, workload: Workload, groups: list[tuple[int, int]], compute_device: str
    ) -> None:
        todo: dict[tuple[object, ...], tuple[int, int]] = {}
        for size, host_ranks in groups:
            key = self._key(workload, size, host_ranks, compute_device)
            if key not in self._cache:
                todo.setdefault(key, (size, host_ranks))
        if self.workers < 2 or len(todo) < 2:
            return
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        global _FORKED
        self._model(workload)  # built once, inherited by every worker
        order = sorted(todo.items(), key=lambda item: -item[1][0])  # the longest plans first
        _FORKED = (self, workload, compute_device, [group for _, group in order])
        context = multiprocessing.get_context("fork")  # no re-import; nothing pickled but L
        try:  # a worker that dies (out of memory) raises BrokenProcessPool here, never hangs
            with ProcessPoolExecutor(min(self.workers, len(order)), mp_context=context) as pool:
                planned = list(pool.map(_plan_forked, range(len(order))))
        finally:
            _FORKED = None
        for (key, _), layouts in zip(order, planned, strict=True):
            self._cache[key] = layouts

    @staticmethod
    def _key(
        workload: Workload, group_size: int, host_ranks: int, compute_device: str
    ) -> tuple[object, ...]:
        local = math.gcd(group_size, max(1, host_ranks))
        tables = tuple(_table_key(t) + (t.name,) for t in workload.tables)
        return (tables, workload.batch_size_per_rank, group_size, local, compute_device)

    def _model(self, workload: Workload) -> tuple[Any, dict[str, Any]]:
        """One meta model (and constraints) for every ``L`` of the workload's tables."""
        tables = tuple(_table_key(t) + (t.name,) for t in workload.tables)
        if tables not in self._modules:
            self._modules[tables] = _meta_model(workload)
        return self._modules[tables]

    def _plan(
        self, workload: Workload, group_size: int, host_ranks: int, compute_device: str
    ) -> list[GroupLayout]:
        local = math.gcd(group_size, max(1, host_ranks))
        module, constraints = self._model(workload)
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
        return [GroupLayout(group_size, PROPOSAL, tuple(_shards(placed, workload, counts)))]


_FORKED: tuple[TorchRecGroupPlanner, Workload, str, list[tuple[int, int]]] | None = None
"""What ``prepare``'s forked workers plan: (planner, workload, device, groups)."""


def _plan_forked(index: int) -> list[GroupLayout]:
    assert _FORKED is not None, "set by TorchRecGroupPlanner.prepare before it forks"
    planner, workload, compute_device, groups = _FORKED
    size, host_ranks = groups[index]
    return planner._plan(workload, size, host_ranks, compute_device)


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
