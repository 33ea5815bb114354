"""``sparse2d.train.config.paths``: directories the trainer will write are probed before any
process group forms, and a bad one is one line naming its key and the fix."""

from __future__ import annotations

import os
import subprocess
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
