"""The pure refusals of FULLY_SHARDED (no process group needed)."""

from __future__ import annotations

import pytest
from torchrec.distributed.types import ParameterSharding, ShardingPlan, ShardingStrategy

from sparse2d import ConfigError
from sparse2d.sync.fully_sharded.checks import (
    check_fully_sharded_options,
    check_fully_sharded_plan,
)
from sparse2d.sync.options import SyncOptions

FS = ShardingStrategy.FULLY_SHARDED


def test_options_that_do_not_apply_are_refused() -> None:
    with pytest.raises(ConfigError, match="every=4"):
        check_fully_sharded_options(FS, SyncOptions(every=4))
    check_fully_sharded_options(ShardingStrategy.PER_MODULE, SyncOptions(every=4))
    check_fully_sharded_options(FS, SyncOptions())  # the defaults are fine
    check_fully_sharded_options(ShardingStrategy.DEFAULT, SyncOptions(every=4))


def test_skipping_the_finite_vote_is_refused_and_what_does_not_apply_is_accepted() -> None:
    """FullyShardedEmbeddings always votes on NaN/inf before its reduce-scatter (which
    overwrites each replica's only copy), so ``check_finite=False`` would be silently
    ignored: it is refused instead, as the trainer's config used to do on its own."""
    with pytest.raises(ConfigError, match="check_finite=False"):
        check_fully_sharded_options(FS, SyncOptions(check_finite=False))
    with pytest.raises(ConfigError, match="include_optimizer_state=False"):
        check_fully_sharded_options(FS, SyncOptions(include_optimizer_state=False))
    with pytest.raises(ConfigError, match="engine='sparse'"):
        check_fully_sharded_options(FS, SyncOptions(engine="sparse"))
    # every row is reduce-scattered each step: auto has nothing to choose, hide nothing to hide
    check_fully_sharded_options(FS, SyncOptions(engine="auto", hide=True, divergence_every=5))
    check_fully_sharded_options(ShardingStrategy.DEFAULT, SyncOptions(check_finite=False))


def _plan(kernel: str) -> ShardingPlan:
    from torchrec.distributed.types import EmbeddingModuleShardingPlan

    sharding = ParameterSharding(sharding_type="table_wise", compute_kernel=kernel, ranks=[0])
    return ShardingPlan({"ebc": EmbeddingModuleShardingPlan({"t0": sharding})})


def test_plans_without_the_plain_fused_kernel_are_refused() -> None:
    with pytest.raises(ConfigError, match="ebc.t0 'fused_uvm_caching'"):
        check_fully_sharded_plan(FS, _plan("fused_uvm_caching"))
    check_fully_sharded_plan(FS, _plan("fused"))
    check_fully_sharded_plan(ShardingStrategy.DEFAULT, _plan("fused_uvm_caching"))
