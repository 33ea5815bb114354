"""The pure refusals of FULLY_SHARDED plans (no process group needed); the sync options it
replaces are ``sparse2d.option_conflicts``' rules (tests/test_option_conflicts.py)."""

from __future__ import annotations

import pytest
from torchrec.distributed.types import ParameterSharding, ShardingPlan, ShardingStrategy

from sparse2d import ConfigError
from sparse2d.core.fully_sharded.checks import check_fully_sharded_plan

FS = ShardingStrategy.FULLY_SHARDED


def _plan(kernel: str) -> ShardingPlan:
    from torchrec.distributed.types import EmbeddingModuleShardingPlan

    sharding = ParameterSharding(sharding_type="table_wise", compute_kernel=kernel, ranks=[0])
    return ShardingPlan({"ebc": EmbeddingModuleShardingPlan({"t0": sharding})})


def test_plans_without_the_plain_fused_kernel_are_refused() -> None:
    with pytest.raises(ConfigError, match="ebc.t0 'fused_uvm_caching'"):
        check_fully_sharded_plan(FS, _plan("fused_uvm_caching"))
    check_fully_sharded_plan(FS, _plan("fused"))
    check_fully_sharded_plan(ShardingStrategy.DEFAULT, _plan("fused_uvm_caching"))
