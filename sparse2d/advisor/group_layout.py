"""Where every shard lands inside one sharding group of ``L`` ranks, from TorchRec's planner.

A group's layout depends on ``L`` (and on how many of its ranks share a host), never on
the number of groups, so it is computed once per ``L`` and cached. TorchRec's own parts
do the work: ``EmbeddingEnumerator`` (with its perf and storage estimators) lists the
sharding options of every table on a meta-device model and ``GreedyPerfPartitioner``
places them on a ``Topology`` of ``L`` devices; no process group is involved.

To plan 832 tables for 4096 ranks in seconds, tables that are identical for the planner
(rows, dim, features, pooling factor, forced type) are enumerated once and their
options cloned (the options of identical tables are identical); the partitioner then
places every clone. Proposals kept: each table's fastest option and each table's smallest
option (as TorchRec's ``GreedyProposer`` would try them), and one per sharding type: every
table that TorchRec offers that type for takes its fastest option of it, the others their
fastest option. The cost model then judges all of them under its own terms, so a table's
sharding type can change with ``L`` (row-wise inside one host, table-row-wise or grid once
the group spans hosts) where TorchRec's own estimators would not switch.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sparse2d.advisor.workload import TableLoad, Workload
from sparse2d.errors import PlanError

PROPOSALS = ("min_perf", "min_storage")


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

    def layouts(
        self, workload: Workload, group_size: int, host_ranks: int, compute_device: str
    ) -> list[GroupLayout]:
        local = math.gcd(group_size, max(1, host_ranks))
        key = (
            tuple(_table_key(t) + (t.name,) for t in workload.tables),
            workload.batch_size_per_rank,
            group_size,
            local,
            compute_device,
        )
        if key not in self._cache:
            with _quiet_torchrec():
                self._cache[key] = self._plan(workload, group_size, local, compute_device)
        return self._cache[key]

    def _plan(
        self, workload: Workload, group_size: int, local: int, compute_device: str
    ) -> list[GroupLayout]:
        import torch
        from torchrec import EmbeddingBagCollection
        from torchrec.distributed.planner import Topology
        from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
        from torchrec.distributed.planner.types import ParameterConstraints
        from torchrec.modules.embedding_configs import EmbeddingBagConfig

        from sparse2d.planner.sharders import MODEL_PARALLEL_TYPES, default_sharders

        groups: dict[tuple[object, ...], list[TableLoad]] = {}
        for table in workload.tables:
            groups.setdefault(_table_key(table), []).append(table)
        reps = {f"rep{i}": members for i, members in enumerate(groups.values())}
        configs, constraints = [], {}
        for name, members in reps.items():
            t = members[0]
            configs.append(
                EmbeddingBagConfig(
                    name=name,
                    embedding_dim=t.dim,
                    num_embeddings=t.rows,
                    feature_names=[f"{name}_f{j}" for j in range(t.features)],
                )
            )
            constraints[name] = ParameterConstraints(
                sharding_types=[t.sharding] if t.sharding else list(MODEL_PARALLEL_TYPES),
                compute_kernels=["fused"],
                pooling_factors=[t.pooling_factor] * t.features,
            )
        module = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
        huge = 2**60  # place everything; the cost model judges the fit against real memory
        topology = Topology(
            world_size=group_size,
            compute_device=compute_device,
            local_world_size=local,
            hbm_cap=huge if compute_device == "cuda" else None,
            ddr_cap=huge,
        )
        enumerator = EmbeddingEnumerator(
            topology=topology, batch_size=workload.batch_size_per_rank, constraints=constraints
        )
        options = enumerator.enumerate(module, default_sharders())
        by_rep: dict[str, list[object]] = {}
        for option in options:
            by_rep.setdefault(option.name, []).append(option)
        missing = sorted(set(reps) - set(by_rep))
        if missing:
            raise PlanError(
                f"TorchRec offers no sharding option for tables {[reps[m][0].name for m in missing]} "
                f"at {group_size} ranks; check their forced sharding type."
            )

        def storage(o: object) -> int:
            return sum(s.storage.hbm + s.storage.ddr for s in o.shards)  # type: ignore[attr-defined]

        layouts: list[GroupLayout] = []
        seen: dict[tuple[int, ...], GroupLayout] = {}
        for proposal in PROPOSALS + tuple(f"prefer_{t}" for t in MODEL_PARALLEL_TYPES):
            picks = {}
            for rep, opts in by_rep.items():
                typed = [o for o in opts if f"prefer_{o.sharding_type}" == proposal]  # type: ignore[attr-defined]
                if typed:
                    picks[rep] = min(typed, key=lambda o: (o.total_perf, storage(o)))  # type: ignore[attr-defined]
                elif proposal != "min_storage":
                    picks[rep] = min(opts, key=lambda o: (o.total_perf, storage(o)))  # type: ignore[attr-defined]
                else:
                    picks[rep] = min(opts, key=lambda o: (storage(o), o.total_perf))  # type: ignore[attr-defined]
            ident = tuple(id(picks[rep]) for rep in reps)
            if ident not in seen:  # proposals often pick the same options
                seen[ident] = self._partition(picks, reps, topology, workload, proposal)
                layouts.append(seen[ident])
        return layouts

    @staticmethod
    def _partition(
        picks: dict[str, Any],
        reps: dict[str, list[TableLoad]],
        topology: Any,
        workload: Workload,
        proposal: str,
    ) -> GroupLayout:
        """Place one clone per table; a uniform (row-wise) option once for all its tables.

        A uniform option puts shard ``i`` on rank ``i`` whatever else is placed and adds the
        same load to every rank, so its identical tables share one placement (``count``).
        """
        from torchrec.distributed.planner.partitioners import GreedyPerfPartitioner

        chosen, counts = [], {}
        for rep, members in reps.items():
            best = picks[rep]
            uniform = best.partition_by == "uniform"
            for member in members[:1] if uniform else members:
                clone = copy.copy(best)
                clone.name = member.name
                clone.shards = [copy.copy(s) for s in best.shards]
                chosen.append(clone)
                counts[member.name] = len(members) if uniform else 1
        placed = GreedyPerfPartitioner().partition(chosen, topology)
        group_size = len(topology.devices)
        return GroupLayout(group_size, proposal, tuple(_shards(placed, workload, counts)))


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
