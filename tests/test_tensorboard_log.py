"""TensorBoard event files written by a real trainer run, read back with TensorBoard's reader."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from sparse2d.train.tensorboard_log import TensorBoardLog, scalars
from tests.conftest import ROOT


def _events(path) -> EventAccumulator:
    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def _records(run_dir) -> list[dict]:
    return [json.loads(line) for line in open(run_dir / "metrics.jsonl")]


def test_trainer_writes_every_logged_scalar_at_its_step(tiny_runs) -> None:
    run = tiny_runs["2d"]
    files = list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 1, files  # rank 0 only
    acc = _events(run / "tensorboard")
    tags = set(acc.Tags()["scalars"])
    train = ["loss", "auc", "ne", "samples_per_s", "sync_s_per_step", "sync_bytes_per_step"]
    expected = {f"train/{k}" for k in train} | {"eval/loss", "eval/auc", "eval/ne"}
    expected |= {f"train/sync_modes/{m}" for m in ("dense", "sparse")}
    expected |= {"train/replica_divergence"}
    expected |= {"balance/lookup_max_over_mean", "balance/memory_max_bytes"}
    assert expected <= tags, sorted(expected - tags)
    # every number of every train/eval record, at its step, with its value
    for record in _records(run):
        if record["kind"] not in ("train", "eval"):
            continue
        for tag, value in scalars(record).items():
            events = {e.step: e.value for e in acc.Scalars(tag)}
            assert record["step"] in events, (tag, record["step"], events)
            assert events[record["step"]] == pytest.approx(value, rel=1e-6), tag
    assert [e.step for e in acc.Scalars("train/loss")] == [2, 4, 6]
    assert [e.step for e in acc.Scalars("eval/auc")] == [3, 6]
    assert [e.step for e in acc.Scalars("train/replica_divergence")] == [2, 4, 6]
    modes = sum(acc.Scalars(f"train/sync_modes/{m}")[-1].value for m in ("dense", "sparse"))
    assert modes == 6  # engine auto: one sync per step, counted under the mode it chose
    assert acc.Scalars("train/sync_bytes_per_step")[-1].value > 0
    start = acc.Tensors("run/start/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "environment.torch" in start and "| world_size | 2 |" in start


def test_tensorboard_off_writes_no_events(tiny_runs) -> None:
    assert not (tiny_runs["1d"] / "tensorboard").exists()
    assert (tiny_runs["1d"] / "summary.json").exists()


def test_a_new_feature_record_needs_no_new_code(tmp_path) -> None:
    """Any record with numbers becomes scalars: later features log and appear."""
    log = TensorBoardLog(str(tmp_path))
    log.write({"kind": "ft", "step": 5, "heals": 1, "healed_from": "group 1"}, step=0)
    log.write({"kind": "mc", "evictions": {"table_a": 7, "table_b": 0}}, step=9)
    log.close()
    acc = _events(tmp_path / "tensorboard")
    assert set(acc.Tags()["scalars"]) == {
        "ft/heals",
        "mc/evictions/table_a",
        "mc/evictions/table_b",
    }
    assert [(e.step, e.value) for e in acc.Scalars("ft/heals")] == [(5, 1.0)]
    assert [(e.step, e.value) for e in acc.Scalars("mc/evictions/table_a")] == [(9, 7.0)]


def test_scalars_names_and_skips() -> None:
    record = {
        "kind": "train",
        "step": 3,
        "train_loss": 0.5,
        "samples_per_s": 10,
        "ok": True,
        "nan": float("nan"),
        "device": "cpu",
        "sync_modes": {"dense": 2},
    }
    assert scalars(record) == {
        "train/loss": 0.5,
        "train/samples_per_s": 10.0,
        "train/sync_modes/dense": 2.0,
    }


def test_library_and_trainer_import_without_tensorboard() -> None:
    """``tensorboard`` is the trainer's optional dependency: without it the library and
    the trainer import, and asking for event files is a config error before any collective."""
    code = (
        "import sys; sys.modules['tensorboard'] = None; sys.modules['torch.utils.tensorboard'] = None\n"
        "import sparse2d, sparse2d.core.collection, sparse2d.train.loop, sparse2d.train.cli, sparse2d.train.report\n"
        "from sparse2d.train.config import load_config\n"
        "fresh = 'run_dir=' + __import__('tempfile').mkdtemp()  # not `make train`'s\n"
        "load_config('configs/tiny_cpu.yaml', ['metrics.tensorboard=false', fresh]).check_runtime(4)\n"
        "try:\n"
        "    load_config('configs/tiny_cpu.yaml', [fresh]).check_runtime(4)\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("ConfigError metrics.tensorboard=true needs the tensorboard")
    assert "metrics.tensorboard=false" in out.stdout
