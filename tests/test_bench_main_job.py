"""One-iteration smoke test of bench/main_job_bench.py: two trainer steps per setting, in the
shared world (the trainer's launch is tested in tests/test_train.py and tests/test_launch.py)."""

from __future__ import annotations

import argparse

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
from main_job_bench import _markdown, measure

from tests import trainer_world


def test_main_job_bench_two_steps(world4) -> None:
    def in_world(overrides, steps, run_dir, env=None):
        assert env is None, env  # environment variables would need a fresh launch
        summary, _ = trainer_world.train(
            world4,
            *overrides,
            f"train.steps={steps}",
            "train.eval_every=0",
            "train.eval_batches=1",
            f"run_dir={run_dir}",
        )
        return summary

    settings = {"1D (L=4)": ["parallel.sharding_group_size=4"], "2D (L=2)": []}
    results = measure(settings, 2, 1, runner=in_world)
    for runs in results.values():
        assert len(runs) == 1 and runs[0]["samples_per_s"] > 0, runs
    assert results["1D (L=4)"][0]["sync_bytes_per_step"] == 0
    assert results["2D (L=2)"][0]["sync_bytes_per_step"] > 0
    assert results["2D (L=2)"][0]["sync_modes"], results  # engine auto reports its choices
    args = argparse.Namespace(steps=2, rounds=1, machine="test")
    assert "2D (default) / 1D" in _markdown(results, args, 1.0)
