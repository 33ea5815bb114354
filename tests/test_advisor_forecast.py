"""The forecast: 1D and the best L per world, with compute and link bounds (same cost model)."""

from __future__ import annotations

import pytest

from sparse2d.advisor.cost_model import AnalyticCostModel
from sparse2d.advisor.forecast import forecast, format_forecast, link_rate
from sparse2d.advisor.group_layout import TorchRecGroupPlanner
from sparse2d.advisor.topology import ClusterTopology
from sparse2d.advisor.workload import TableLoad, Workload
from sparse2d.errors import ConfigError

TABLES = tuple(TableLoad(f"t{i}", 1000, 16, sharding="table_wise") for i in range(8))
WORKLOAD = Workload(tables=TABLES, batch_size_per_rank=64, replica_layout="inter_host")


def cluster(world: int) -> ClusterTopology:
    return ClusterTopology(
        world_size=world,
        ranks_per_host=2,
        compute_device="cpu",
        device_memory_bytes=2**30,
        intra_host_bw=1e9,
        intra_host_latency_s=1e-5,
        inter_host_bw=1e8,
        inter_host_latency_s=1e-4,
        lookup_bw=1e9,
        dense_flops=1e9,
        host_link_bw=5e7,
    )


def test_each_world_is_the_cost_models_own_estimate_with_its_bounds() -> None:
    """Catches a point priced on another world's topology, a bound taken from the other
    layout, or the link bound at a rank's share instead of the host's link."""
    planner = TorchRecGroupPlanner()
    points = forecast(WORKLOAD, cluster, [4, 8], planner)
    assert [p.world for p in points] == [4, 8]
    for p in points:
        own = AnalyticCostModel(WORKLOAD, cluster(p.world), planner).estimate(p.world)
        assert p.one_d.step_s == pytest.approx(own.step_s)
        assert p.samples_per_rank(p.one_d) == pytest.approx(64 / own.step_s)
        assert p.compute_bound(p.one_d) == pytest.approx(64 / own.compute_s)
        assert p.link_bound(p.one_d) == pytest.approx(64 * 5e7 / own.host_link_bytes)
        assert p.best is not None and p.best.step_s <= p.one_d.step_s
    assert points[1].one_d.host_link_bytes > points[0].one_d.host_link_bytes
    table = format_forecast(points).splitlines()
    assert len(table) == 4 and table[2].startswith("| 4 | ")
    assert points[0].as_json()["1d"]["sharding_group_size"] == 4  # type: ignore[index]


def test_one_host_has_no_link_and_a_bad_world_is_refused() -> None:
    one_host = cluster(2)
    assert link_rate(one_host) == 0.0
    (point,) = forecast(WORKLOAD, cluster, [2])
    assert point.link_bound(point.one_d) is None
    with pytest.raises(ConfigError, match="world size must be >= 1"):
        forecast(WORKLOAD, cluster, [0])
