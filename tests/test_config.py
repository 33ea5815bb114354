"""Config loading: strict keys, types, values, overrides, runtime checks, reference docs."""

from __future__ import annotations

import dataclasses
from typing import get_args, get_origin, get_type_hints

import pytest

from sparse2d.errors import ConfigError
from sparse2d.train.config import (
    Config,
    apply_override,
    field_docs,
    load_config,
    reference,
)

TINY = "configs/tiny_cpu.yaml"


def _error(overrides: list[str], path: str | None = TINY) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_overrides_parse_yaml_values() -> None:
    cfg = load_config(
        TINY,
        [
            "train.steps=7",
            "optimizer.sparse.lr=1e-3",  # PyYAML reads this as a string; accepted for floats
            "parallel.sharding_group_size=null",
            "model.tables.0.rows=[5, 5, 5, 5, 5, 5]",
            "parallel.sync={every: 3, include_optimizer_state: false}",
        ],
    )
    assert cfg.train.steps == 7
    assert cfg.optimizer.sparse.lr == pytest.approx(1e-3)
    assert cfg.parallel.sharding_group_size is None and cfg.group_size(8) == 8
    assert [t.rows for t in cfg.model.specs()] == [5] * 6
    assert cfg.parallel.sync.every == 3 and not cfg.parallel.sync.include_optimizer_state


def test_table_count_expands_names_and_features() -> None:
    cfg = load_config(TINY)
    specs = cfg.model.specs()
    assert [t.name for t in specs] == [f"t_{i}" for i in range(6)]
    assert cfg.model.feature_names == [f"t_{i}" for i in range(6)]
    assert [t.rows for t in specs] == [10_000] * 6
    listed = load_config(TINY, ["model.tables=[{name: t, count: 2, rows: [5, 7], dim: 16}]"])
    assert [t.rows for t in listed.model.specs()] == [5, 7]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["optimzer.sparse.lr=0.1"],
            "unknown key 'optimzer' in section '<top level>'; valid keys:",
        ),
        (
            ["optimizer.sparse.lrr=0.1"],
            "unknown key 'lrr' in section 'optimizer.sparse'; valid keys: kind, lr, eps",
        ),
        (["train.steps=ten"], "train.steps='ten' must be int, not str"),
        (["train.progress_bar=1"], "train.progress_bar=1 must be bool"),
        (["optimizer.sparse.lr=-0.1"], "optimizer.sparse.lr=-0.1 must be > 0"),
        (
            ["optimizer.dense.kind=lamb"],
            "optimizer.dense.kind='lamb' must be one of 'sgd', 'adagrad', 'adam'",
        ),
        (["model.tables.0.dim=8"], "model.dense_arch=[32, 16] must end in the tables' dim 8"),
        (["model.over_arch=[4, 2]"], "model.over_arch=[4, 2] must end in 1"),
        (["model.tables.0.rows=[1, 2]"], "model.tables[0].rows=[1, 2] has 2 entries but count=6"),
        (["parallel.sync.every=0"], "parallel.sync.every=0 must be an int >= 1"),
        (["parallel.sync.compression=fp8"], "parallel.sync.compression='fp8' must be one of"),
        (["data.source=criteo"], "data.criteo.train_files=[] is empty"),
        (["model.tables.3.rows=1"], "'model.tables.3' needs an index below 1"),
        (["train.steps"], "override 'train.steps' must look like dotted.key=value"),
        (["parallel.timeout_s=0"], "parallel.timeout_s=0.0 must be > 0"),
        (
            ["checkpoint.every=7", "parallel.sync.every=2"],
            "checkpoint.every=7 must be a multiple of parallel.sync.every=2",
        ),
        (["train.resume=always"], "train.resume='always' must be one of 'none', 'auto'"),
        (["checkpoint.keep=0"], "checkpoint.keep=0 must be > 0"),
        (["parallel.sync.check_finite=maybe"], "parallel.sync.check_finite='maybe' must be bool"),
    ],
)
def test_bad_values_name_the_key(overrides: list[str], expected: str) -> None:
    assert expected in _error(overrides)


def test_missing_model_is_reported() -> None:
    assert "missing required key 'model'" in _error([], path=None)


def test_world_size_check_names_every_factor(tmp_path) -> None:
    cfg = load_config(TINY, ["parallel.sharding_group_size=3", f"run_dir={tmp_path}"])
    cfg.check_runtime(world_size=6, local_world_size=3)
    with pytest.raises(ConfigError) as info:
        cfg.check_runtime(world_size=8, local_world_size=4)
    message = str(info.value)
    assert "parallel.sharding_group_size=3 does not divide world_size=8" in message
    assert "2 node(s) x 4 process(es) per node" in message and "8 % 3 = 2" in message
    assert "[1, 2, 4, 8]" in message


def test_missing_data_path(tmp_path) -> None:
    present = tmp_path / "day_0.tsv"
    present.write_text("0" + "\t" * 39 + "\n")  # one row (an empty file is its own error)
    cfg = load_config(
        TINY,
        [
            "data.source=criteo",
            "model.tables=[{name: cat, count: 26, rows: 100, dim: 16}]",
            f"data.criteo.train_files=[{present}]",
            f"data.criteo.eval_files=[{tmp_path / 'nope.tsv'}]",
            f"run_dir={tmp_path / 'run'}",
        ],
    )
    with pytest.raises(ConfigError, match=r"data\.criteo\.eval_files\[0\]=.*nope\.tsv.*not found"):
        cfg.check_runtime(world_size=4)
    cfg.check_runtime(world_size=4, check_paths=False)


def test_apply_override_creates_sections() -> None:
    data: dict = {}
    apply_override(data, "a.b.c=[1, 2]")
    assert data == {"a": {"b": {"c": [1, 2]}}}


def test_every_field_is_documented_and_docs_are_current() -> None:
    queue: list[type] = [Config]
    seen = 0
    while queue:
        cls = queue.pop()
        docs, hints = field_docs(cls), get_type_hints(cls)
        for spec in dataclasses.fields(cls):
            seen += 1
            assert docs.get(spec.name), f"{cls.__name__}.{spec.name} has no docstring"
            tp = hints[spec.name]
            inner = get_args(tp)[0] if get_origin(tp) is list else tp
            if dataclasses.is_dataclass(inner):
                queue.append(inner)
    assert seen > 50
    with open("docs/CONFIG.md") as f:
        assert f.read() == reference(), (
            "regenerate: python -m sparse2d.train.config --reference > docs/CONFIG.md"
        )


def test_reference_header_says_where_it_comes_from() -> None:
    """docs/CONFIG.md names its generator and the command that regenerates it, and that
    command (as launchers and Makefile run modules) reproduces the file."""
    import subprocess
    import sys

    head = reference().split("## `top level`")[0]
    assert "sparse2d/train/config/io.py" in head and "do not edit by hand" in head
    command = "python -m sparse2d.train.config --reference > docs/CONFIG.md"
    assert command in head
    out = subprocess.run(
        [sys.executable, "-m", "sparse2d.train.config", "--reference"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    with open("docs/CONFIG.md") as f:
        assert f.read() == out


def test_cli_config_subcommand(capsys) -> None:
    from sparse2d.cli import main

    assert main(["config", "--check", TINY, "--world-size", "4"]) == 0
    assert main(["config", "--check", TINY, "--world-size", "3"]) == 1
    assert "does not divide world_size=3" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("parallel.sync.momentum_scaling=true", "momentum_scaling=True"),
        ("parallel.sharding_strategy=fully_sharded", "sharding_strategy=FULLY_SHARDED"),
        ("train.pipeline=semi_sync", "pipeline=semi_sync"),
    ],
)
def test_managed_collision_refusals_come_at_load_time(override: str, named: str) -> None:
    """What the library refuses for MC tables, the loader refuses before any process starts,
    with the same reason (``sparse2d.sync.mc_rules``)."""
    overrides = ["model.managed_collision.enabled=true", override]
    with pytest.raises(ConfigError) as info:
        load_config("configs/tiny_cpu.yaml", overrides)
    message = str(info.value)
    assert "model.managed_collision.enabled=true" in message and named in message
    load_config("configs/tiny_cpu.yaml", [override])  # alone it is fine
