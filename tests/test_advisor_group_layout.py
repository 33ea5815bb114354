"""Group layouts: the plan DMPCollection's planning path makes, on a meta model (no process group)."""

from __future__ import annotations

from collections import defaultdict

from sparse2d.advisor.group_layout import TorchRecGroupPlanner
from sparse2d.advisor.workload import TableLoad, Workload

TABLES = (
    *(TableLoad(f"rw{i}", 1000, 16, sharding="row_wise") for i in range(3)),
    *(TableLoad(f"tw{i}", 300 + i, 16, sharding="table_wise") for i in range(5)),
    TableLoad("free", 5000, 32, features=2, pooling_factor=3.0),
)


def test_layout_covers_every_table_and_stays_inside_the_group() -> None:
    w = Workload(tables=TABLES, batch_size_per_rank=64)
    (layout,) = TorchRecGroupPlanner().layouts(w, 4, 4, "cpu")  # one: the launch's plan
    covered: dict[str, int] = defaultdict(int)
    for s in layout.shards:
        assert 0 <= s.rank < 4 and s.count == 1
        covered[s.table] += s.rows * s.cols
    assert {t.name: t.rows * t.dim for t in TABLES} == dict(covered)
    for i in range(3):  # each row-wise table placed by the partitioner, one shard per rank
        rw = [s for s in layout.shards if s.table == f"rw{i}"]
        assert {s.sharding_type for s in rw} == {"row_wise"}
        assert sorted(s.rank for s in rw) == [0, 1, 2, 3]
    assert sum(len(r) for r in layout.per_rank()) == len(layout.shards)


def test_layout_is_the_plan_dmpcollection_builds() -> None:
    """The advisor prices the plan a launch builds: ``plan_for_group`` (DMPCollection's
    planning path, no process group) on the same meta-device tables places every shard of
    every table on the same rank with the same sharding type."""
    import torch
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    from sparse2d.planner.group_plan import plan_for_group
    from sparse2d.planner.sharders import MODEL_PARALLEL_TYPES, default_sharders

    w = Workload(tables=TABLES, batch_size_per_rank=64)
    module = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name=t.name,
                embedding_dim=t.dim,
                num_embeddings=t.rows,
                feature_names=[f"{t.name}_f{j}" for j in range(t.features)],
            )
            for t in TABLES
        ],
        device=torch.device("meta"),
    )
    constraints = {
        t.name: ParameterConstraints(
            sharding_types=[t.sharding] if t.sharding else list(MODEL_PARALLEL_TYPES),
            compute_kernels=["fused"],
            pooling_factors=[t.pooling_factor] * t.features,
        )
        for t in TABLES
    }
    for size, local in ((4, 4), (8, 4)):
        launch = plan_for_group(
            module, size, "cpu", default_sharders(), constraints, local, None, 64
        ).plan
        built = set()
        for tables in launch.plan.values():
            for name, sharding in tables.items():  # type: ignore[union-attr]
                for shard in sharding.sharding_spec.shards:  # type: ignore[union-attr]
                    rows, cols = shard.shard_sizes
                    built.add((name, sharding.sharding_type, shard.placement.rank(), rows, cols))
        (layout,) = TorchRecGroupPlanner().layouts(w, size, local, "cpu")
        advised = {(s.table, s.sharding_type, s.rank, s.rows, s.cols) for s in layout.shards}
        assert advised == built, size


def test_layouts_are_cached_per_group_size() -> None:
    planner = TorchRecGroupPlanner()
    w = Workload(tables=(TableLoad("t", 100, 8),), batch_size_per_rank=8)
    first = planner.layouts(w, 2, 2, "cpu")
    assert planner.layouts(w, 2, 2, "cpu") is first
    assert planner.layouts(w, 4, 2, "cpu") is not first


def test_layouts_planned_in_workers_equal_those_planned_here() -> None:
    """``prepare`` with two workers (forked, largest L first) caches the same layouts one
    process makes when asked; asking again plans nothing more."""
    w = Workload(tables=TABLES, batch_size_per_rank=64)
    groups = [(2, 2), (4, 4), (8, 4)]
    parallel = TorchRecGroupPlanner(workers=2)
    parallel.prepare(w, groups, "cpu")
    assert len(parallel._cache) == 3
    here = TorchRecGroupPlanner()
    for size, local in groups:
        assert parallel.layouts(w, size, local, "cpu") == here.layouts(w, size, local, "cpu")
    parallel.prepare(w, groups, "cpu")
    assert len(parallel._cache) == 3


def test_workers_below_one_are_refused() -> None:
    import pytest

    with pytest.raises(ValueError, match="workers=0 must be >= 1"):
        TorchRecGroupPlanner(workers=0)
