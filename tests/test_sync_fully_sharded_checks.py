"""The pure refusals of FULLY_SHARDED (no process group needed)."""

from __future__ import annotations

import pytest
from torchrec.distributed.types import ParameterSharding, ShardingPlan, ShardingStrategy

from sparse2d import ConfigError
from sparse2d.sync.fully_sharded.checks import (
    check_fully_sharded_options,
    check_fully_sharded_plan,
)
from sparse2d.sync.policy import SyncOptions

FS = ShardingStrategy.FULLY_SHARDED


def test_options_that_do_not_apply_are_refused() -> None:
    with pytest.raises(ConfigError, match="every=4"):
        check_fully_sharded_options(FS, SyncOptions(every=4))
    check_fully_sharded_options(ShardingStrategy.PER_MODULE, SyncOptions(every=4))
    check_fully_sharded_options(FS, SyncOptions())  # the defaults are fine
    check_fully_sharded_options(ShardingStrategy.DEFAULT, SyncOptions(every=4))


def _plan(kernel: str) -> ShardingPlan:
    from torchrec.distributed.types import EmbeddingModuleShardingPlan

    sharding = ParameterSharding(sharding_type="table_wise", compute_kernel=kernel, ranks=[0])
    return ShardingPlan({"ebc": EmbeddingModuleShardingPlan({"t0": sharding})})


def test_plans_without_the_plain_fused_kernel_are_refused() -> None:
    with pytest.raises(ConfigError, match="ebc.t0 'fused_uvm_caching'"):
        check_fully_sharded_plan(FS, _plan("fused_uvm_caching"))
    check_fully_sharded_plan(FS, _plan("fused"))
    check_fully_sharded_plan(ShardingStrategy.DEFAULT, _plan("fused_uvm_caching"))
