"""``sparse2d.train.recorder``: the run directory's files, written by rank 0 only, in both
trainer modes' formats (a fault-tolerant group labels its lines and stamps the wall time)."""

from __future__ import annotations

import json
import time

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from sparse2d.train.config import load_config
from sparse2d.train.recorder import Recorder
from tests.conftest import ROOT


def _cfg(run_dir, *overrides: str):
    return load_config(f"{ROOT}/configs/tiny_cpu.yaml", [f"run_dir={run_dir}", *overrides])


def test_rank0_writes_config_metrics_tensorboard_and_summary(tmp_path, capsys) -> None:
    cfg = _cfg(tmp_path, "metrics.tensorboard=true")
    rec = Recorder(cfg, str(tmp_path), is_main=True)
    rec.log({"kind": "train", "step": 10, "train_loss": 0.5, "path": "x"}, step=3)
    rec.log({"kind": "balance", "lookup_max_over_mean": 1.25}, step=7)  # no step: the given one
    rec.write_summary({"steps": 10, "eval_auc": 0.75})
    rec.close()
    assert load_config(str(tmp_path / "config.yaml")).to_dict() == cfg.to_dict()
    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert records[0] == {"kind": "train", "step": 10, "train_loss": 0.5, "path": "x"}
    assert "time" not in records[1]
    assert json.loads((tmp_path / "summary.json").read_text()) == {"steps": 10, "eval_auc": 0.75}
    assert not list(tmp_path.glob("*.tmp"))
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(10, 0.5)]
    assert [e.step for e in acc.Scalars("balance/lookup_max_over_mean")] == [7]
    out = capsys.readouterr().out.splitlines()
    assert out == ["[train] step=10 train_loss=0.5 path=x", "[balance] lookup_max_over_mean=1.25"]


def test_group_label_wall_time_and_appending_across_restarts(tmp_path, capsys) -> None:
    cfg = _cfg(tmp_path, "metrics.tensorboard=false")
    before = time.time()
    for restart in range(2):  # a restarted process appends to the same metrics.jsonl
        rec = Recorder(cfg, str(tmp_path / "replica_1"), True, "replica=1", wall_time=True)
        rec.log({"kind": "heal", "step": 5 + restart, "from_group": 0}, step=0)
        rec.say("done", "nothing to rejoin")
        rec.close()
    records = [json.loads(line) for line in open(tmp_path / "replica_1" / "metrics.jsonl")]
    assert [r["step"] for r in records] == [5, 6]
    assert all(before - 1 <= r["time"] <= time.time() + 1 for r in records)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("[heal] replica=1 step=5 from_group=0 time=")
    assert out[1] == "[done] replica=1 nothing to rejoin"
    assert not (tmp_path / "replica_1" / "tensorboard").exists()  # metrics.tensorboard off


def test_other_ranks_write_and_print_nothing(tmp_path, capsys) -> None:
    rec = Recorder(_cfg(tmp_path / "run"), str(tmp_path / "run"), is_main=False)
    rec.log({"kind": "train", "step": 1}, step=1)
    rec.write_summary({"steps": 1})
    rec.close()
    assert not (tmp_path / "run").exists() and capsys.readouterr().out == ""
