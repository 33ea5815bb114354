"""The ``parallel`` config section (sparse2d.train.config.parallel): its sync section is
``SyncOptions`` itself (trainer defaults, errors naming ``parallel.sync.*``), and
FULLY_SHARDED refuses, by the library's rule, the sync options it replaces."""

from __future__ import annotations

import pytest

from sparse2d.errors import ConfigError
from sparse2d.sync.options import SyncOptions
from sparse2d.train.config import load_config
from sparse2d.train.config.parallel import ParallelConfig

TINY = "configs/tiny_cpu.yaml"


def _error(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(TINY, overrides)
    return str(info.value)


def test_sync_section_is_sync_options_with_the_library_defaults() -> None:
    cfg = load_config(TINY, ["parallel.sync.every=4", "parallel.sync.delayed_optimizer_state=true"])
    sync = cfg.parallel.sync
    assert type(sync) is SyncOptions and (sync.every, sync.delayed_optimizer_state) == (4, True)
    # keys the YAML leaves out keep the library's defaults: one default everywhere (the
    # main job's YAML sets engine auto itself)
    assert (sync.engine, sync.hide) == ("auto", True)
    assert (SyncOptions().engine, SyncOptions().hide) == ("dense", True)
    assert load_config(TINY, ["parallel.sync.hide=false"]).parallel.sync.hide is False


def test_bad_sync_values_name_the_dotted_key() -> None:
    assert _error(["parallel.sync.every=0"]).startswith("parallel.sync.every=0 must be")
    assert _error(["parallel.sync.divergence_rows=0"]).startswith("parallel.sync.divergence_rows=0")
    message = _error(
        [
            "parallel.sync.delayed_optimizer_state=true",
            "parallel.sync.include_optimizer_state=false",
        ]
    )
    assert message.startswith("parallel.sync.delayed_optimizer_state=True")
    assert "must be one of 'dense', 'sparse', 'auto'" in _error(["parallel.sync.engine=fast"])
    assert "unknown key 'bogus' in section 'parallel.sync'" in _error(["parallel.sync.bogus=1"])


def test_fully_sharded_strategy_and_the_sync_options_it_replaces() -> None:
    from torchrec.distributed.types import ShardingStrategy

    cfg = load_config(TINY, ["parallel.sharding_strategy=fully_sharded"])
    assert cfg.parallel.strategy() == ShardingStrategy.FULLY_SHARDED
    assert load_config(TINY).parallel.strategy() == ShardingStrategy.DEFAULT
    message = _error(["parallel.sharding_strategy=fully_sharded", "parallel.sync.every=4"])
    assert "parallel.sharding_strategy" in message and "sync.every=4" in message
    message = _error(
        ["parallel.sharding_strategy=fully_sharded", "parallel.sync.delayed_optimizer_state=true"]
    )
    assert "sync.delayed_optimizer_state=True" in message
    assert "fully_sharded" in _error(["parallel.sharding_strategy=full"])
    # the library's rule: no skipped NaN/inf vote; hide and engine=auto do not apply
    message = _error(
        ["parallel.sharding_strategy=fully_sharded", "parallel.sync.check_finite=false"]
    )
    assert "sync.check_finite=False" in message and "NaN/inf vote" in message
    for harmless in ("parallel.sync.hide=false", "parallel.sync.engine=dense"):
        load_config(TINY, ["parallel.sharding_strategy=fully_sharded", harmless])
    assert "sync.engine='sparse'" in _error(
        ["parallel.sharding_strategy=fully_sharded", "parallel.sync.engine=sparse"]
    )


def test_bad_sync_options_are_refused_when_the_section_is_built() -> None:
    with pytest.raises(ConfigError, match="node_group_size=0 must be > 0"):
        ParallelConfig(node_group_size=0)
    with pytest.raises(ConfigError, match="every=0 must be an int >= 1"):
        SyncOptions(every=0)


@pytest.mark.parametrize(
    "override", ["parallel.auto.candidates=0", "parallel.auto={timed_steps: 5}"]
)
def test_the_retired_auto_trial_section_is_refused_naming_it_and_the_runs(override: str) -> None:
    """``parallel.auto`` configured the measured trial of ``sharding_group_size: auto``,
    retired by measurement (issue 66): one line naming the key and the stored runs."""
    message = _error(["parallel.sharding_group_size=auto", override])
    assert message.startswith("parallel.auto was retired: ") and "\n" not in message
    assert "bench/RESULTS.md, section auto" in message


def test_an_unknown_parallel_key_still_lists_the_valid_keys() -> None:
    message = _error(["parallel.autos=1"])
    assert message.startswith("unknown key 'autos' in section 'parallel'; valid keys: ")
    assert "sharding_group_size" in message and "auto," not in message
