"""Group layouts from TorchRec's enumerator and partitioner on a meta model (no process group)."""

from __future__ import annotations

from collections import defaultdict

from sparse2d.advisor.group_layout import TorchRecGroupPlanner
from sparse2d.advisor.workload import TableLoad, Workload


def test_layout_covers_every_table_and_stays_inside_the_group() -> None:
    tables = (
        *(TableLoad(f"rw{i}", 1000, 16, sharding="row_wise") for i in range(3)),
        *(TableLoad(f"tw{i}", 300 + i, 16, sharding="table_wise") for i in range(5)),
        TableLoad("free", 5000, 32, features=2, pooling_factor=3.0),
    )
    w = Workload(tables=tables, batch_size_per_rank=64)
    for layout in TorchRecGroupPlanner().layouts(w, 4, 4, "cpu"):
        covered: dict[str, int] = defaultdict(int)
        for s in layout.shards:
            assert 0 <= s.rank < 4
            covered[s.table] += s.rows * s.cols
            if s.count > 1:  # identical row-wise tables share one placement
                covered.update({f"rw{i}": covered[s.table] for i in range(3)})
        assert {t.name: t.rows * t.dim for t in tables} == dict(covered)
        rw = [
            s for s in layout.shards if s.sharding_type == "row_wise" and s.table.startswith("rw")
        ]
        assert sorted(s.rank for s in rw) == [0, 1, 2, 3] and {s.count for s in rw} == {3}
        assert sum(len(r) for r in layout.per_rank()) == len(layout.shards)


def test_layouts_are_cached_per_group_size() -> None:
    planner = TorchRecGroupPlanner()
    w = Workload(tables=(TableLoad("t", 100, 8),), batch_size_per_rank=8)
    first = planner.layouts(w, 2, 2, "cpu")
    assert planner.layouts(w, 2, 2, "cpu") is first
    assert planner.layouts(w, 4, 2, "cpu") is not first
