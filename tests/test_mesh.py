"""rank_layout is pure; build_mesh yields process groups matching it."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from sparse2d.core.resources import GroupRecorder
from sparse2d.errors import ConfigError
from sparse2d.mesh import build_mesh, rank_layout, replica_groups


def test_design_example_intra_host() -> None:
    assert rank_layout(8, 4, "intra_host") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert replica_groups(8, 4, "intra_host") == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_design_example_inter_host() -> None:
    assert rank_layout(8, 4, "inter_host") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert replica_groups(8, 4, "inter_host") == [[0, 4], [1, 5], [2, 6], [3, 7]]


@pytest.mark.parametrize(
    "world,group", [(1, 1), (4, 1), (4, 2), (4, 4), (16, 4), (24, 6), (4096, 256)]
)
@pytest.mark.parametrize("layout", ["intra_host", "inter_host"])
def test_layout_partitions_world(world: int, group: int, layout: str) -> None:
    groups = rank_layout(world, group, layout)
    assert len(groups) == world // group and all(len(g) == group for g in groups)
    assert sorted(r for g in groups for r in g) == list(range(world))
    replicas = replica_groups(world, group, layout)
    # Replicas of shard r are the r-th ranks of every group.
    assert replicas == [[g[r] for g in groups] for r in range(group)]
    if layout == "intra_host":  # replicas adjacent: group g's r-th rank is g + G*r
        assert all(
            g[r] == gi + (world // group) * r for gi, g in enumerate(groups) for r in range(group)
        )
        assert all(rs == list(range(rs[0], rs[0] + world // group)) for rs in replicas)
    else:
        assert all(g == list(range(g[0], g[0] + group)) for g in groups)


@pytest.mark.parametrize(
    "world,group,layout,message",
    [
        (8, 3, "intra_host", "world_size=8 is not divisible by sharding_group_size=3"),
        (8, 0, "intra_host", "sharding_group_size=0 is outside 1..8"),
        (8, 16, "intra_host", "sharding_group_size=16 is outside 1..8"),
        (8, 4, "rack", "replica_layout='rack' is unknown"),
    ],
)
def test_bad_layout_arguments(world: int, group: int, layout: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        rank_layout(world, group, layout)


def check_mesh_groups(group: int, layout: str) -> tuple[list[int], list[int]]:
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = GroupRecorder()
    with groups.recording():
        mesh = build_mesh(world, group, layout, "cpu", rank)
    try:
        return _compare_with_layout(mesh, rank, world, group, layout)
    finally:
        groups.destroy()  # the mesh's two groups, as DMPCollection.close() does


def _compare_with_layout(
    mesh, rank: int, world: int, group: int, layout: str
) -> tuple[list[int], list[int]]:
    sharding = dist.get_process_group_ranks(mesh.sharding_pg)
    replica = dist.get_process_group_ranks(mesh.replica_pg)
    expected_group = next(g for g in rank_layout(world, group, layout) if rank in g)
    expected_replicas = next(r for r in replica_groups(world, group, layout) if rank in r)
    if sharding != expected_group or replica != expected_replicas:
        raise AssertionError((rank, sharding, expected_group, replica, expected_replicas))
    if mesh.device_mesh.mesh_dim_names != ("replicate", "shard"):
        raise AssertionError(mesh.device_mesh.mesh_dim_names)
    return sharding, replica


@pytest.mark.parametrize("layout", ["intra_host", "inter_host"])
def test_mesh_process_groups_match_layout(world4, layout: str) -> None:
    results = world4.run(check_mesh_groups, 2, layout)
    if layout == "intra_host":
        assert results[0] == ([0, 2], [0, 1]) and results[3] == ([1, 3], [2, 3])
    else:
        assert results[0] == ([0, 1], [0, 2]) and results[3] == ([2, 3], [1, 3])
