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
        (["parallel.sync.engine=fp8"], "parallel.sync.engine='fp8' must be one of"),
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


def test_cli_config_subcommand(capsys, tmp_path) -> None:
    from sparse2d.train.cli import main

    fresh = f"run_dir={tmp_path / 'run'}"  # not runs/tiny_cpu: `make train` may have run there
    assert main(["config", "--check", TINY, "--world-size", "4", fresh]) == 0
    assert main(["config", "--check", TINY, "--world-size", "3", fresh]) == 1
    assert "does not divide world_size=3" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("parallel.sync.momentum_scaling=true", "parallel.sync.momentum_scaling=True"),
        ("parallel.sharding_strategy=fully_sharded", "parallel.sharding_strategy='fully_sharded'"),
        ("train.pipeline=semi_sync", "train.pipeline='semi_sync'"),
    ],
)
def test_managed_collision_refusals_come_at_load_time(override: str, named: str) -> None:
    """What the library refuses for MC tables, the loader refuses before any process starts,
    with the same rule (``sparse2d.option_conflicts``)."""
    overrides = ["model.managed_collision.enabled=true", override]
    with pytest.raises(ConfigError) as info:
        load_config("configs/tiny_cpu.yaml", overrides)
    message = str(info.value)
    assert "model.managed_collision.kind='mch'" in message and named in message
    load_config("configs/tiny_cpu.yaml", [override])  # alone it is fine


def test_a_config_at_its_own_world_size_says_it_runs_1d() -> None:
    """The shipped Criteo config (groups of 4 for 8 GPUs) launched with 4 processes is one
    replica, 1D: the trainer says so in one line naming the key and a 2D choice."""
    cfg = load_config("configs/dlrm_criteo_1host_8gpu.yaml")
    note = cfg.one_replica_note(4)
    assert note is not None and note.startswith(
        "parallel.sharding_group_size=4 equals the world size 4: one replica of every shard, "
        "so this run is 1D"
    )
    assert "parallel.sharding_group_size=2" in note and "launch 8 processes" in note
    assert cfg.one_replica_note(8) is None  # 2 replicas: 2D as written
    assert load_config(TINY).one_replica_note(4) is None  # null: not a set size


def test_the_trainer_prints_the_1d_note_once(tmp_path) -> None:
    import os
    import subprocess
    import sys

    from tests.reader_env import ROOT, reader_env

    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "sparse2d.train",
        "--config",
        TINY,
        "parallel.sharding_group_size=2",
        "train.steps=2",
        "train.eval_batches=1",
        "metrics.tensorboard=false",
        f"run_dir={tmp_path}",
    ]
    env = reader_env(OMP_NUM_THREADS="1")
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    notes = [x for x in run.stderr.splitlines() if "so this run is 1D" in x]
    assert len(notes) == 1 and notes[0].startswith("sparse2d.train: rank 0: note: "), notes
    assert os.path.exists(tmp_path / "summary.json")


def test_the_documented_criteo_cpu_recipe_is_a_valid_2d_config() -> None:
    """docs/training.md's Criteo-on-CPU command, as written: its overrides load, pass the
    world checks at NPROC=4 and make a 2D run (2 replicas), not the silent 1D one."""
    import shlex

    from tests.reader_env import ROOT

    text = (ROOT / "docs" / "training.md").read_text()
    start = text.index("NPROC=4 CONFIG=configs/dlrm_criteo_1host_8gpu.yaml launch/local.sh")
    words = shlex.split(text[start : text.index("```", start)].replace("\\\n", " "))
    assert words[:3] == ["NPROC=4", "CONFIG=configs/dlrm_criteo_1host_8gpu.yaml", "launch/local.sh"]
    cfg = load_config(str(ROOT / "configs" / "dlrm_criteo_1host_8gpu.yaml"), words[3:])
    cfg.check_runtime(4, 4, check_paths=False)
    assert cfg.one_replica_note(4) is None and cfg.group_size(4) == 2
    assert cfg.device == "cpu" and cfg.model.tables[0].rows == 100000
