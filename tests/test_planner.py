"""Planning for one group on meta-device models, with a Topology and no process group."""

from __future__ import annotations

import pytest
import torch
from torchrec.distributed.types import ShardingType

from sparse2d.errors import PlanError
from sparse2d.planner.group_plan import _plan_locally, remap_plan, validate_plan
from sparse2d.planner.sharders import MODEL_PARALLEL_TYPES, default_sharders
from tests.models import MIXED_TABLES, PooledModel, Table, constraints_for

ALL_TYPES = tuple(Table(f"t{i}", 64, 16, kind) for i, kind in enumerate(MODEL_PARALLEL_TYPES))


def plan(tables: tuple[Table, ...], ranks: int, node: int | None = None):
    return _plan_locally(
        PooledModel(tables, device="meta"),
        ranks,
        "cpu",
        default_sharders(),
        constraints_for(tables),
        node or ranks,
        batch_size=8,
    )


def test_sharders_offer_every_model_parallel_type_on_cpu() -> None:
    ebc, ec, *_ = default_sharders()
    assert set(ebc.sharding_types("cpu")) == set(MODEL_PARALLEL_TYPES)
    assert ShardingType.DATA_PARALLEL.value not in ec.sharding_types("cpu")


def test_managed_collision_sharders_offer_kernels_the_device_runs() -> None:
    """TorchRec's MC sharders offer UVM/key-value kernels on CPU too; its planner then
    fails on a CPU topology. Row-wise is the only type TorchRec's MC modules shard."""
    mc_ebc, mc_ec = default_sharders()[2:]
    for sharder in (mc_ebc, mc_ec):
        assert sharder.sharding_types("cpu") == [ShardingType.ROW_WISE.value]
        assert sharder.compute_kernels(ShardingType.ROW_WISE.value, "cpu") == ["fused"]
        assert "fused_uvm_caching" in sharder.compute_kernels(ShardingType.ROW_WISE.value, "cuda")


def test_plan_honours_every_sharding_type_on_cpu() -> None:
    result = plan(ALL_TYPES, 4, node=2)
    got = {table: s.sharding_type for table, s in result.plan["ebc"].items()}
    assert got == {t.name: t.sharding for t in ALL_TYPES}
    validate_plan(result, 4)


def test_remap_intra_host_places_shards_on_group_ranks() -> None:
    result = plan(MIXED_TABLES, 2)
    group = [1, 3]  # group 1 of world 4, L=2, intra_host
    remapped = remap_plan(result, group, torch.device("cpu"))
    for table, sharding in remapped.plan["ebc"].items():
        original = result.plan["ebc"][table]
        assert sharding.ranks == [group[r] for r in original.ranks]
        for shard in sharding.sharding_spec.shards:
            assert shard.placement.rank() in group
            assert str(shard.placement).endswith("/cpu"), str(shard.placement)
    # The original plan is left untouched for the other groups.
    assert all(r in (0, 1) for s in result.plan["ebc"].values() for r in s.ranks)


def test_plan_for_more_ranks_than_group_is_rejected() -> None:
    with pytest.raises(
        PlanError, match=r"sharding group has 2 ranks \(0..1\).*Topology\(world_size=2\)"
    ):
        validate_plan(plan(MIXED_TABLES, 4), 2)


def test_row_wise_plan_for_fewer_ranks_is_rejected() -> None:
    with pytest.raises(PlanError, match="row_wise over 2 ranks, but row-wise sharding must span"):
        validate_plan(plan(MIXED_TABLES, 2), 4)
