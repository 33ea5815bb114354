"""``sparse2d.option_conflicts``: each rule refuses its combination, through every caller that
knows its keys, with one line naming the keys, the values, the reason and the fix; near
misses pass. No process group: options and configs are built directly."""

from __future__ import annotations

import re

import pytest

from sparse2d.core.pipeline_guard import refuse_early_lookup
from sparse2d.errors import ConfigError, KeyValueError
from sparse2d.option_conflicts import (
    EARLY_LOOKUP_PIPELINES,
    RULES,
    Rule,
    check_collection,
    check_fault_tolerance,
    conflicts,
    key_name,
    sync_settings,
)
from sparse2d.sync.options import SyncOptions
from sparse2d.train.config import load_config
from sparse2d.train.config.schema import TRAINER_KEYS

TINY = "configs/tiny_cpu.yaml"
BASE = ["parallel.sync.divergence_every=0", "parallel.sync.engine=dense"]
"""The main job, plain: no divergence metric, the dense engine (a stream runs it alone)."""
FT = ["fault_tolerance.enable=true", "fault_tolerance.num_groups=2"]
MC = ["model.managed_collision.enabled=true"]
FS = ["parallel.sharding_strategy=fully_sharded"]


def rule(*options: str) -> Rule:
    (found,) = [r for r in RULES if r.options == options]
    return found


TRAINER: dict[tuple[str, ...], list[str]] = {
    ("delayed_state", "no_optimizer_state"): [
        "parallel.sync.delayed_optimizer_state=true",
        "parallel.sync.include_optimizer_state=false",
    ],
    ("momentum_scaling", "no_optimizer_state"): [
        "parallel.sync.momentum_scaling=true",
        "parallel.sync.include_optimizer_state=false",
    ],
    ("stream", "delayed_state"): [
        "parallel.sync.stream=true",
        "parallel.sync.delayed_optimizer_state=true",
    ],
    ("fully_sharded", "stream"): [*FS, "parallel.sync.stream=true"],
    ("fully_sharded", "sync_every_4"): [*FS, "parallel.sync.every=4"],
    ("fully_sharded", "sparse_engine"): [*FS, "parallel.sync.engine=sparse"],
    ("fully_sharded", "delayed_state"): [*FS, "parallel.sync.delayed_optimizer_state=true"],
    ("fully_sharded", "momentum_scaling"): [*FS, "parallel.sync.momentum_scaling=true"],
    ("fully_sharded", "no_optimizer_state"): [*FS, "parallel.sync.include_optimizer_state=false"],
    ("fully_sharded", "no_check_finite"): [*FS, "parallel.sync.check_finite=false"],
    ("managed_collision", "momentum_scaling"): [*MC, "parallel.sync.momentum_scaling=true"],
    ("managed_collision", "fully_sharded"): [*MC, *FS],
    ("managed_collision", "pipeline_semi_sync"): [*MC, "train.pipeline=semi_sync"],
    ("checkpoint_every", "mch_eviction_interval"): [
        *MC,
        "model.managed_collision.eviction_interval=4",
        "checkpoint.every=10",
    ],
    ("checkpoint_every", "sync_every"): ["checkpoint.every=7", "parallel.sync.every=2"],
    ("fault_tolerance", "fully_sharded"): [*FT, *FS],
    ("fault_tolerance", "auto_group_size"): [*FT, "parallel.sharding_group_size=auto"],
    ("fault_tolerance", "delayed_state"): [*FT, "parallel.sync.delayed_optimizer_state=true"],
    ("fault_tolerance", "stream"): [*FT, "parallel.sync.stream=true"],
    ("fault_tolerance", "no_optimizer_state"): [*FT, "parallel.sync.include_optimizer_state=false"],
    ("fault_tolerance", "no_check_finite"): [*FT, "parallel.sync.check_finite=false"],
    ("fault_tolerance", "divergence_metric"): [*FT, "parallel.sync.divergence_every=5"],
    ("fault_tolerance", "inter_host"): [*FT, "parallel.replica_layout=inter_host"],
}
"""Trainer overrides that break exactly one rule (on ``configs/tiny_cpu.yaml``, world 4)."""

WORLD_SIZE_RULES = {
    ("fault_tolerance", "sharding_group_size"),
    ("node_group_size", "sharding_group_size"),
}
"""Rules that need the world size: the loader applies them in ``check_runtime``."""

LIBRARY_ONLY = {
    ("managed_collision", "custom_all_reduce"),
    ("fault_tolerance", "custom_all_reduce"),
}
"""Rules on a library argument the trainer has no key for (tested below)."""


def load(overrides: list[str]) -> object:
    return load_config(TINY, [*BASE, "parallel.sharding_group_size=null", *overrides])


def test_every_rule_is_tested_here_and_reads_only_known_keys() -> None:
    tested = set(TRAINER) | WORLD_SIZE_RULES | LIBRARY_ONLY
    assert {r.options for r in RULES} == tested
    assert len({r.options for r in RULES}) == len(RULES), "two rules relate the same options"
    known = set(sync_settings(SyncOptions())) | {
        "sharding_strategy",
        "sharding_group_size",
        "node_group_size",
        "world_size",
        "replica_layout",
        "fault_tolerance",
        "managed_collision",
        "mch.eviction_interval",
        "pipeline",
        "custom_all_reduce",
        "checkpoint.every",
    }
    for r in RULES:
        assert set(r.keys) <= known, r.options
        assert len(r.keys) >= 2 and len(r.reason) > 20 and r.fix, r.options
        # the caller's error names the first key: every message starts with it
        assert not r.head or r.head.startswith(f"{{{r.keys[0]}=}}"), r.options


@pytest.mark.parametrize("options", sorted(TRAINER), ids="-".join)
def test_the_config_loader_refuses_each_rule_naming_its_dotted_keys(
    options: tuple[str, ...],
) -> None:
    r = rule(*options)
    with pytest.raises(KeyValueError) as info:
        load(TRAINER[options])
    message = str(info.value)
    assert "\n" not in message and "{" not in message, message
    assert message.startswith(key_name(r.keys[0], TRAINER_KEYS) + "="), message
    section = key_name(r.keys[0], TRAINER_KEYS).rpartition(".")[0] + "."
    for key in r.keys:
        if r.head and f"{{{key}=}}" not in r.head:
            continue  # read, not named (managed_collision's kind for the eviction rule)
        # SyncOptions raises its own rules: the loader prefixes its section to the first key
        assert key_name(key, TRAINER_KEYS).removeprefix(section) in message, (key, message)
    assert f": {r.reason}; " in message, message
    # each override alone is no conflict: the rule refuses the combination, not an option
    for override in TRAINER[options]:
        if override not in FT:
            load([override])


@pytest.mark.parametrize(
    "overrides",
    [
        [*FS, "parallel.sync.engine=auto", "parallel.sync.hide=true"],
        [*FS, "parallel.sync.divergence_every=5", "parallel.sync.divergence_rows=8"],
        [*FT, "parallel.sync.engine=sparse", "parallel.sync.momentum_scaling=true"],
        [*FT, "parallel.sync.hide=false", "parallel.sync.every=4", *MC],
        [*FT, "train.pipeline=semi_sync", "checkpoint.every=20"],
        [*MC, "train.pipeline=sparse_dist", "parallel.sync.engine=sparse"],
        [*MC, "model.managed_collision.kind=zch", "model.managed_collision.eviction_interval=4"]
        + ["checkpoint.every=10"],
        ["checkpoint.every=8", "parallel.sync.every=4", "parallel.sync.momentum_scaling=true"],
        ["parallel.sync.hide=false", "parallel.sync.engine=dense"],
    ],
)
def test_combinations_no_rule_refuses_load(overrides: list[str]) -> None:
    load(overrides)


def test_fault_tolerance_group_size_rule_needs_the_world_size() -> None:
    cfg = load_config("configs/ft_tiny_cpu.yaml", ["parallel.sharding_group_size=1"])
    with pytest.raises(KeyValueError, match="each torchrun world .* is one sharding group") as info:
        cfg.check_runtime(2, 2, check_paths=False)
    assert str(info.value).startswith("parallel.sharding_group_size=1 with fault_tolerance.enable")
    load_config("configs/ft_tiny_cpu.yaml", ["parallel.sharding_group_size=2"]).check_runtime(
        2, 2, check_paths=False
    )


def test_node_group_size_must_divide_the_sharding_group() -> None:
    """The loader at the world size (a null group is the whole world) and the library."""
    from sparse2d.validation import resolve_node_group_size

    with pytest.raises(KeyValueError, match="parallel.node_group_size=3 must divide") as info:
        load(["parallel.node_group_size=3"]).check_runtime(4, 4, check_paths=False)
    assert "parallel.sharding_group_size=None (of world_size=4)" in str(info.value)
    with pytest.raises(KeyValueError, match="node_group_size=4 must divide .*=2 "):
        load(["parallel.node_group_size=4", "parallel.sharding_group_size=2"]).check_runtime(
            4, 4, check_paths=False
        )
    load(["parallel.node_group_size=2"]).check_runtime(4, 4, check_paths=False)
    load(["parallel.node_group_size=3", "parallel.sharding_group_size=auto"])  # not chosen yet
    with pytest.raises(ConfigError, match=r"^node_group_size=4 must divide sharding_group_size=2"):
        resolve_node_group_size(4, 2, 2, "intra_host")
    assert resolve_node_group_size(2, 4, 1, "intra_host") == 2


@pytest.mark.parametrize(
    ("kwargs", "key", "value"),
    [
        (
            {"delayed_optimizer_state": True, "include_optimizer_state": False},
            "delayed_optimizer_state",
            True,
        ),
        ({"momentum_scaling": True, "include_optimizer_state": False}, "momentum_scaling", True),
        ({"stream": True, "delayed_optimizer_state": True}, "stream", True),
    ],
)
def test_sync_options_refuse_their_own_rules_naming_the_field(
    kwargs: dict, key: str, value: object
) -> None:
    """The loader prefixes ``parallel.sync.``: the key is the bare field."""
    with pytest.raises(KeyValueError) as info:
        SyncOptions(**kwargs)
    assert info.value.key == key
    assert str(info.value).startswith(f"{key}={value!r} cannot run with ")


@pytest.mark.parametrize(
    ("sync", "word"),
    [
        ({"every": 4}, "sync_options.every=4"),
        ({"delayed_optimizer_state": True}, "sync_options.delayed_optimizer_state=True"),
        ({"momentum_scaling": True}, "sync_options.momentum_scaling=True"),
        ({"include_optimizer_state": False}, "sync_options.include_optimizer_state=False"),
        ({"check_finite": False}, "sync_options.check_finite=False"),
        ({"engine": "sparse"}, "sync_options.engine='sparse'"),
    ],
)
def test_dmpcollection_refuses_what_fully_sharded_replaces(sync: dict, word: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(word)) as info:
        check_collection(SyncOptions(**sync), "FULLY_SHARDED", [], custom_all_reduce=False)
    assert str(info.value).startswith("sharding_strategy='FULLY_SHARDED' cannot run with")
    check_collection(SyncOptions(**sync), "DEFAULT", [], custom_all_reduce=False)
    check_collection(SyncOptions(**sync), "TABLE_WISE", [], custom_all_reduce=True)


def test_fully_sharded_accepts_what_does_not_apply() -> None:
    options = SyncOptions(engine="auto", hide=True, divergence_every=5)
    check_collection(options, "FULLY_SHARDED", [], custom_all_reduce=True)  # the hook is kept


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        (
            {"sync_options": SyncOptions(delayed_optimizer_state=True)},
            "sync_options.delayed_optimizer_state=True",
        ),
        (
            {"sync_options": SyncOptions(include_optimizer_state=False)},
            "sync_options.include_optimizer_state=False",
        ),
        ({"sync_options": SyncOptions(check_finite=False)}, "sync_options.check_finite=False"),
        ({"sync_options": SyncOptions(divergence_every=3)}, "sync_options.divergence_every=3"),
        ({"sync_options": SyncOptions(every=4, stream=True)}, "sync_options.stream=True"),
        ({"fully_sharded": True}, "sharding_strategy='FULLY_SHARDED'"),
        ({"custom_all_reduce": True}, "custom_all_reduce=True"),
    ],
)
def test_fault_tolerance_refuses_before_connecting(kwargs: dict, word: str) -> None:
    args = {"sync_options": SyncOptions(), "fully_sharded": False, "custom_all_reduce": False}
    with pytest.raises(ConfigError, match=re.escape(word)) as info:
        check_fault_tolerance(**(args | kwargs))
    assert str(info.value).startswith("fault_tolerance=True cannot run with")
    assert str(info.value).endswith("or disable fault tolerance.")


def test_fault_tolerance_accepts_what_it_runs() -> None:
    for options in (
        SyncOptions(),
        SyncOptions(engine="sparse", momentum_scaling=True, every=4),
        SyncOptions(engine="dense", hide=False, divergence_rows=8),
    ):
        check_fault_tolerance(options, fully_sharded=False, custom_all_reduce=False)


def test_managed_collision_tables_refuse_a_hook_and_early_lookup_pipelines() -> None:
    tables = ["ebc.t0"]
    with pytest.raises(ConfigError, match=r"managed-collision tables=\['ebc.t0'\] cannot run with"):
        check_collection(SyncOptions(), "DEFAULT", tables, custom_all_reduce=True)
    check_collection(SyncOptions(), "DEFAULT", [], custom_all_reduce=True)
    for pipeline in ("TrainPipelineSemiSync", "TrainPipelineFusedSparseDist", "semi_sync"):
        assert pipeline in EARLY_LOOKUP_PIPELINES
        settings = {"managed_collision": tables, "pipeline": pipeline}
        assert conflicts(settings) == [rule("managed_collision", "pipeline_semi_sync")]
    assert conflicts({"managed_collision": tables, "pipeline": "TrainPipelineSparseDist"}) == []


def test_early_lookup_pipeline_over_a_model_without_synced_tables_passes() -> None:
    """``refuse_early_lookup`` reads the model's sync policy: a plain module has none."""
    import torch.nn as nn

    refuse_early_lookup(nn.Linear(2, 2), "TrainPipelineSemiSync")


def test_a_rule_runs_only_when_every_key_it_reads_is_known() -> None:
    fs = {"sharding_strategy": "fully_sharded"}
    assert conflicts(fs) == []
    assert conflicts(fs | {"sync.every": 2}) == [rule("fully_sharded", "sync_every_4")]
