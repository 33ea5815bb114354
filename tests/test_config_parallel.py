"""The ``parallel`` config section (sparse2d.train.config_parallel): its sync keys are
``SyncOptions``' keys, and FULLY_SHARDED refuses the sync options it replaces."""

from __future__ import annotations

import dataclasses

import pytest

from sparse2d.errors import ConfigError
from sparse2d.train.config import load_config
from sparse2d.train.config_parallel import ParallelConfig, SyncConfig

TINY = "configs/tiny_cpu.yaml"


def _error(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(TINY, overrides)
    return str(info.value)


def test_sync_section_maps_one_to_one_onto_sync_options() -> None:
    from sparse2d.sync.policy import SyncOptions

    mine = [f.name for f in dataclasses.fields(SyncConfig)]
    theirs = [f.name for f in dataclasses.fields(SyncOptions)]
    assert mine == theirs
    options = load_config(TINY, ["parallel.sync.every=4"]).parallel.sync.options()
    assert isinstance(options, SyncOptions) and options.every == 4


def test_fully_sharded_strategy_and_the_sync_options_it_replaces() -> None:
    from torchrec.distributed.types import ShardingStrategy

    cfg = load_config(TINY, ["parallel.sharding_strategy=fully_sharded"])
    assert cfg.parallel.strategy() == ShardingStrategy.FULLY_SHARDED
    assert load_config(TINY).parallel.strategy() == ShardingStrategy.DEFAULT
    message = _error(["parallel.sharding_strategy=fully_sharded", "parallel.sync.every=4"])
    assert "parallel.sharding_strategy" in message and "sync.every=4" in message
    message = _error(["parallel.sharding_strategy=fully_sharded", "parallel.sync.overlap=true"])
    assert "sync.overlap=True" in message
    assert "fully_sharded" in _error(["parallel.sharding_strategy=full"])


def test_bad_sync_options_are_refused_when_the_section_is_built() -> None:
    with pytest.raises(ConfigError, match="node_group_size=0 must be > 0"):
        ParallelConfig(node_group_size=0)
    with pytest.raises(ConfigError, match="every=0 must be > 0"):
        SyncConfig(every=0)
