"""The trainer's measured ``auto`` at world 4 (one world, three runs): it trains at the L its
trial measured fastest (over two passes: a re-measured near-tie), from exactly the state an
explicit run at that L starts from (final weights and optimizer state bit-identical); a failing candidate is skipped with a log line;
when every candidate fails, every rank stops with one line naming each L and why."""

from __future__ import annotations

import contextlib
import io
import logging
import os
from typing import Any

import torch

from tests import trainer_world
from tests.state_views import flat_state

COMMON = [
    "train.progress_bar=false",
    "train.steps=4",
    "train.log_every=2",
    "train.eval_every=0",
    "train.eval_batches=1",
    "parallel.sync.engine=dense",  # engine auto picks by timing
    "parallel.node_group_size=2",  # L=1 cannot take it: a real candidate failure
    "parallel.auto.margin=100",
    "parallel.auto.warmup_steps=1",
    "parallel.auto.timed_steps=2",
    "parallel.auto.retrial_margin=100",  # both survivors re-measured: a trial of two passes
]


def _run(overrides: list[str]) -> tuple[dict[str, Any], str, dict[str, torch.Tensor]]:
    import torch.distributed as dist

    from sparse2d.train.config import load_config
    from sparse2d.train.loop import Loop
    from sparse2d.train.model_builder import resolve_device

    cfg = load_config(os.path.join(trainer_world.ROOT, "configs/tiny_cpu.yaml"), overrides)
    cfg.check_runtime(dist.get_world_size(), dist.get_world_size())
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        loop = Loop(cfg, resolve_device(cfg))
        try:
            summary = loop.run()
            state = flat_state(
                {
                    "model": loop.model.state_dict(),
                    "fused": loop.model.fused_optimizer.state_dict(),
                    "dense": loop.optimizer.state_dict()["state"],
                }
            )
        finally:
            loop.model.close()
        dist.barrier()
    return summary, out.getvalue(), state


def auto_then_explicit(run_dir: str) -> dict[str, Any]:
    """One rank: the auto run, the explicit run at its pick, and the all-fail run."""
    from sparse2d.errors import TrialError

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("sparse2d.advisor.trial").addHandler(handler)
    logging.disable(logging.NOTSET)  # the shared workers mute WARNING (TorchRec's plan chatter)
    try:
        auto, log, auto_state = _run(
            [*COMMON, "parallel.sharding_group_size=auto", f"run_dir={run_dir}/auto"]
        )
    finally:
        logging.disable(logging.WARNING)
        logging.getLogger("sparse2d.advisor.trial").removeHandler(handler)
    chosen = auto["sharding_group_size"]
    _, _, fixed_state = _run(
        [*COMMON, f"parallel.sharding_group_size={chosen}", f"run_dir={run_dir}/fixed"]
    )
    different = sorted(
        k for k in auto_state if not torch.equal(auto_state[k], fixed_state.get(k, torch.empty(0)))
    )
    try:
        _run(
            [
                *COMMON,
                "parallel.sharding_group_size=auto",
                "parallel.node_group_size=3",
                f"run_dir={run_dir}/none",
            ]
        )
        all_fail = "trained"
    except TrialError as error:
        all_fail = str(error)
    return {
        "summary": auto,
        "log": log,
        "records": records,
        "keys": sorted(auto_state),
        "extra": sorted(set(fixed_state) - set(auto_state)),
        "different": different,
        "all_fail": all_fail,
    }


def test_auto_trains_at_the_measured_best_bit_identical_to_explicit(world4, tmp_path) -> None:
    results = world4.run(auto_then_explicit, str(tmp_path), timeout=600)
    first = results[0]
    trial = first["summary"]["auto_trial"]
    by_l = {c["sharding_group_size"]: c for c in trial["candidates"]}
    assert sorted(by_l) == [1, 2, 4]
    assert by_l[1]["measured_step_s"] is None and "node_group_size=2" in by_l[1]["error"]
    measured = {L: c["measured_step_s"] for L, c in by_l.items() if c["error"] is None}
    assert set(measured) == {2, 4} and all(v > 0 for v in measured.values())
    for L in (2, 4):  # measured twice (reverse order), each keeping its lower time
        passes = by_l[L]["passes_step_s"]
        assert len(passes) == 2 and measured[L] == min(passes), by_l[L]
    fastest = min(measured, key=lambda L: (measured[L], L))
    assert trial["chosen"] == fastest == first["summary"]["sharding_group_size"]
    # the trial stored each candidate's plan: the model it trains is built from the store
    assert first["summary"]["construction"]["plan_cache"] == "hit", first["summary"]
    assert trial["trial_s"] > 0 and all(c["predicted_step_s"] > 0 for c in by_l.values())
    assert "auto sharding_group_size trial" in first["log"] and "<- chosen" in first["log"]
    records = [line for line in open(tmp_path / "auto" / "metrics.jsonl")]
    assert sum('"kind": "auto_trial"' in line for line in records) == 1
    for rank, result in enumerate(results):  # the same pick everywhere, weights bit-identical
        assert result["summary"]["sharding_group_size"] == fastest, rank
        assert result["keys"] and not result["extra"] and not result["different"], (rank, result)
        assert any("L=1 skipped" in r and "node_group_size" in r for r in result["records"])
        message = result["all_fail"]
        assert "\n" not in message and message.startswith("auto: every sharding group size")
        for L in (1, 2, 4):
            assert f"L={L}: ConfigError: node_group_size=3 must divide" in message, message


def test_plan_measure_runs_the_trial_on_a_launched_job(tmp_path) -> None:
    """``sparse2d plan --measure`` under torchrun: the table and one JSON line, no training."""
    import json
    import subprocess
    import sys

    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "sparse2d.train.cli",
        "plan",
        "--config",
        "configs/tiny_cpu.yaml",
        "--measure",
        "parallel.auto.margin=100",
        "parallel.auto.warmup_steps=1",
        "parallel.auto.timed_steps=1",
        f"run_dir={tmp_path}",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = subprocess.run(
        cmd,
        cwd=trainer_world.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "auto sharding_group_size trial (2 candidates" in run.stdout, run.stdout
    report = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("{")))
    assert sorted(c["sharding_group_size"] for c in report["candidates"]) == [1, 2]
    assert report["chosen"] in (1, 2) and not (tmp_path / "summary.json").exists()
