"""The trainer's ``fault_tolerance`` section: values checked, unsupported options refused."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sparse2d.errors import ConfigError
from sparse2d.train.config import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FT = ["fault_tolerance.enable=true", "fault_tolerance.num_groups=2"]


def test_shipped_ft_config_loads_and_runs_one_group_per_world() -> None:
    cfg = load_config("configs/ft_tiny_cpu.yaml")
    assert cfg.fault_tolerance.enable and cfg.fault_tolerance.num_groups == 2
    cfg.check_runtime(2, 2, check_paths=False)
    with pytest.raises(ConfigError, match="each torchrun world .* is one sharding group"):
        load_config("configs/ft_tiny_cpu.yaml", ["parallel.sharding_group_size=1"]).check_runtime(
            2, 2
        )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("fault_tolerance.replica_id=2", r"replica_id=2 must be in 0\.\.1"),
        ("fault_tolerance.min_replica_size=3", "min_replica_size=3 exceeds the 2 groups"),
        ("fault_tolerance.quorum_timeout_s=0", "quorum_timeout_s=0.0 must be > 0"),
        ("fault_tolerance.quorum_every=0", "quorum_every=0 must be a whole number >= 1"),
    ],
)
def test_bad_values(override: str, message: str) -> None:
    """The section is ``FTOptions``: its own checks, naming the dotted key."""
    with pytest.raises(ConfigError, match=f"fault_tolerance.{message}"):
        load_config("configs/ft_tiny_cpu.yaml", [override])


def test_section_is_the_library_options_with_their_names() -> None:
    """Every ``FTOptions`` field is a key of the section under its own name (no mirror to
    drift), and ``options()`` hands the library exactly those values."""
    import dataclasses

    from sparse2d.ft import FTOptions

    cfg = load_config("configs/ft_tiny_cpu.yaml", ["fault_tolerance.quorum_every=7"])
    ft = cfg.fault_tolerance
    keys = [f.name for f in dataclasses.fields(ft)]
    assert keys == [f.name for f in dataclasses.fields(FTOptions)] + ["enable", "commit_log"]
    options = ft.options()
    assert type(options) is FTOptions and options.num_groups == 2 and options.quorum_every == 7
    assert "sync_every" not in keys  # the cadence is parallel.sync.every, once


@pytest.mark.parametrize("where", ["yaml", "override"])
def test_old_group_size_key_names_the_new_one(tmp_path, where: str) -> None:
    """``fault_tolerance.group_size`` (the key before the section became ``FTOptions``) is
    refused in one line that names ``fault_tolerance.num_groups``."""
    path, overrides = "configs/ft_tiny_cpu.yaml", ["fault_tolerance.group_size=2"]
    if where == "yaml":
        with open(path) as f:
            text = f.read().replace("num_groups: 2", "group_size: 2")
        path, overrides = str(tmp_path / "old.yaml"), []
        with open(path, "w") as f:
            f.write(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("fault_tolerance.group_size was renamed fault_tolerance.num_groups")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("parallel.sharding_group_size=auto", "sharding_group_size='auto'"),
        ("parallel.sharding_strategy=fully_sharded", "nothing to heal from"),
        ("parallel.sync.delayed_optimizer_state=true", "delayed_optimizer_state=True"),
        ("parallel.sync.divergence_every=5", "divergence_every=5"),
        ("parallel.sync.check_finite=false", "check_finite=False"),
        ("parallel.sync.include_optimizer_state=false", "include_optimizer_state=False"),
    ],
)
def test_unsupported_options_are_refused_before_anything_starts(
    override: str, message: str
) -> None:
    with pytest.raises(ConfigError, match="fault_tolerance.enable=True cannot run with") as info:
        load_config(
            "configs/tiny_cpu.yaml",
            [
                *FT,
                "parallel.sync.divergence_every=0",
                "parallel.sharding_group_size=null",
                override,
            ],
        )
    assert message in str(info.value)


@pytest.mark.parametrize("override", ["parallel.sync.engine=sparse"])
def test_sparse_engine_is_accepted(override: str) -> None:
    """Touched rows run over torchft's group (tests/test_ft_engines.py)."""
    key, value = override.split("=")
    cfg = load_config("configs/ft_tiny_cpu.yaml", [override])
    assert getattr(cfg.parallel.sync, key.rsplit(".", 1)[1]) == value


@pytest.mark.parametrize("kind", ["mch", "zch"])
def test_managed_collision_tables_are_accepted(kind: str) -> None:
    """Identities merge over the quorum and travel with a heal (tests/test_ft_mc.py)."""
    cfg = load_config(
        "configs/ft_tiny_cpu.yaml",
        ["model.managed_collision.enabled=true", f"model.managed_collision.kind={kind}"],
    )
    assert cfg.model.managed_collision.kind == kind


@pytest.mark.parametrize("kind", ["sparse_dist", "semi_sync"])
def test_torchrec_pipelines_are_accepted(kind: str) -> None:
    """The step boundaries are an optimizer wrapper (sparse2d.ft.FTOptimizer): TorchRec's
    pipelines drive fault-tolerant steps (tests/test_ft_fault_tolerant_steps.py,
    tests/test_ft_launch.py)."""
    cfg = load_config("configs/ft_tiny_cpu.yaml", [f"train.pipeline={kind}"])
    assert cfg.train.pipeline == kind


def test_checkpoints_and_resume_are_accepted() -> None:
    cfg = load_config("configs/ft_tiny_cpu.yaml", ["checkpoint.every=20", "train.resume=auto"])
    assert cfg.checkpoint.every == 20 and cfg.train.resume == "auto"


def test_disabled_section_changes_nothing() -> None:
    cfg = load_config("configs/tiny_cpu.yaml", ["parallel.sync.delayed_optimizer_state=true"])
    assert not cfg.fault_tolerance.enable


@pytest.mark.parametrize(
    "overrides",
    [
        ["parallel.sync.delayed_optimizer_state=true"],  # refused: the refusal table is read
        [
            "model.managed_collision.enabled=true",
            "train.pipeline=sparse_dist",
            "checkpoint.every=50",
        ],
        ["model.managed_collision.enabled=true", "model.managed_collision.kind=zch"],
        ["fault_tolerance.enable=false", "parallel.sharding_strategy=fully_sharded"],
    ],
)
def test_launch_check_imports_no_torch(overrides: list[str]) -> None:
    """The launch scripts validate the config (and read its run_dir) in short Python
    processes before they start anything; the checks of fault tolerance, managed-collision
    tables and FULLY_SHARDED must run without importing torch, TorchRec or the sync engines
    (7 + 5 s of every fault-tolerant launch when they did)."""
    code = (
        "import sys; from sparse2d.train.config import main; "
        "main(['--check', 'configs/ft_tiny_cpu.yaml', '--world-size', '2', "
        "'--local-world-size', '2', *sys.argv[1:]]); "
        "print(sorted(m for m in ('torch', 'torchrec', 'fbgemm_gpu') if m in sys.modules))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, *overrides],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[]", (run.stdout, run.stderr[-2000:])
    refused = overrides == ["parallel.sync.delayed_optimizer_state=true"]
    assert ("torchft forms the next quorum" in run.stderr) == refused, run.stderr[-2000:]
