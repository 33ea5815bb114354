"""``sparse2d.train.config.paths``: directories the trainer will write are probed before any
process group forms, and a bad one is one line naming its key and the fix."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from sparse2d.errors import ConfigError
from sparse2d.train.config import load_config
from sparse2d.train.config.paths import unwritable
from tests.reader_env import ROOT, console_script, reader_env

CONFIG = str(ROOT / "configs" / "tiny_cpu.yaml")


def test_unwritable_probes_the_nearest_existing_directory(tmp_path) -> None:
    """Tests run as root, which passes permission bits: a file as parent and /proc (no
    directory can be made in it) are what root cannot write either."""
    a_file = tmp_path / "file"
    a_file.write_text("")
    assert unwritable(str(tmp_path)) is None
    assert unwritable(str(tmp_path / "new" / "deeper")) is None
    assert not (tmp_path / "new").exists()  # the probe leaves nothing behind
    assert os.listdir(tmp_path) == ["file"]
    assert unwritable(str(a_file / "sub")) == f"{str(a_file)!r} is a file, not a directory"
    assert unwritable("/proc/nope").startswith("cannot create a directory in '/proc' (")


def test_check_runtime_names_the_key(tmp_path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("")
    saves = [f"run_dir={tmp_path}", f"checkpoint.dir={a_file}/sub", "checkpoint.every=10"]
    with pytest.raises(ConfigError, match=r"^checkpoint.dir='.*/file/sub': .* is a file"):
        load_config(CONFIG, saves).check_runtime(4, 4)
    load_config(CONFIG, [*saves[:2], "checkpoint.every=0"]).check_runtime(4, 4)  # never saves
    load_config(CONFIG, saves).check_runtime(4, 4, check_paths=False)  # multinode's check
    with pytest.raises(ConfigError, match=r"^run_dir='/proc/nope': cannot create .*set run_dir"):
        load_config(CONFIG, ["run_dir=/proc/nope"]).check_runtime(4, 4)


def test_trainer_refuses_an_unwritable_checkpoint_dir_at_start(tmp_path) -> None:
    """A rank started without the launcher's check (plain `sparse2d train`) says it at start,
    in one line, instead of at its first save."""
    start = time.monotonic()
    saves = [
        f"run_dir={tmp_path}",
        "parallel.sharding_group_size=1",
        "checkpoint.every=10",
        "checkpoint.dir=/proc/nope",
    ]
    command = [console_script("sparse2d"), "train", "--config", CONFIG, *saves]
    run = subprocess.run(command, cwd=ROOT, env=reader_env(), capture_output=True, text=True)
    assert run.returncode == 1, run.stderr[-2000:]
    lines = [line for line in run.stderr.splitlines() if "checkpoint.dir" in line]
    assert len(lines) == 1 and "checkpoint.dir='/proc/nope': cannot create" in lines[0], run.stderr
    assert time.monotonic() - start < 60


def test_a_run_dir_holding_a_run_is_continued_only_by_a_resume(tmp_path, monkeypatch) -> None:
    """A second run into a run_dir with a run's metrics.jsonl is refused in one line (it
    used to append to them and add a TensorBoard file); train.resume=auto from checkpoints
    kept there continues it, and so does a torchrun restart of the run itself."""
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    run = [f"run_dir={tmp_path}"]
    load_config(CONFIG, run).check_runtime(4, 4)  # empty: a new run
    (tmp_path / "metrics.jsonl").write_text('{"kind": "train", "step": 10}\n')
    with pytest.raises(
        ConfigError,
        match=r"^run_dir='.*' already holds a run .*a second run "
        r"would append to its records: set run_dir to a new directory or delete "
        r"this one\.$",
    ):
        load_config(CONFIG, run).check_runtime(4, 4)
    resume = [*run, "train.resume=auto"]
    with pytest.raises(ConfigError, match="train.resume=auto finds no checkpoint in"):
        load_config(CONFIG, resume).check_runtime(4, 4)
    (tmp_path / "checkpoints" / "step_00000010").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"or continue it: train.resume=auto\.$"):
        load_config(CONFIG, run).check_runtime(4, 4)
    load_config(CONFIG, resume).check_runtime(4, 4)  # continues from its checkpoint
    load_config(CONFIG, run).check_runtime(4, 4, new_run=False)  # a dry run writes no records
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    load_config(CONFIG, run).check_runtime(4, 4)  # torchrun restarted this run


def test_a_fault_tolerant_group_checks_its_own_directory(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    ft = [f"run_dir={tmp_path}", "fault_tolerance.enable=true", "fault_tolerance.num_groups=2"]
    config = str(ROOT / "configs" / "ft_tiny_cpu.yaml")
    (tmp_path / "replica_0").mkdir()
    (tmp_path / "replica_0" / "metrics.jsonl").write_text("{}\n")
    load_config(config, [*ft, "fault_tolerance.replica_id=1"]).check_runtime(2, 2)
    with pytest.raises(ConfigError, match=r"already holds a run \(.*replica_0/metrics.jsonl\)"):
        load_config(config, [*ft, "fault_tolerance.replica_id=0"]).check_runtime(2, 2)


def test_the_launcher_refuses_a_second_run_into_the_same_run_dir(tmp_path) -> None:
    """`launch/local.sh run_dir=D` after a run in D: one line naming run_dir and the fix,
    before torchrun starts."""
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    command = ["launch/local.sh", f"run_dir={tmp_path}"]
    env = reader_env(PYTHON=sys.executable)
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and run.stdout == "", run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "already holds a run" in run.stderr
