from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import DistWorld

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def world2() -> Iterator[DistWorld]:
    world = DistWorld(2)
    yield world
    world.close()


@pytest.fixture(scope="session")
def world4() -> Iterator[DistWorld]:
    world = DistWorld(4)
    yield world
    world.close()


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two tiny real trainer runs on 2 gloo ranks (torchrun), shared by the observability
    tests: ``2d`` (L=1, 2 replicas, TensorBoard on, divergence logged every 2nd sync) and
    ``1d`` (L=2, TensorBoard off). 6 steps, logs at 2/4/6, evals at 3/6."""
    root = tmp_path_factory.mktemp("tiny_runs")
    runs = {"2d": root / "tiny_2d", "1d": root / "tiny_1d"}
    common = ["train.steps=6", "train.log_every=2", "train.eval_every=3", "train.eval_batches=2",
              "train.progress_bar=false", "data.batch_size_per_rank=32"]  # fmt: skip
    extra = {
        "2d": ["parallel.sharding_group_size=1", "parallel.sync.divergence_every=2"],
        "1d": ["parallel.sharding_group_size=2", "metrics.tensorboard=false"],
    }
    for name, run_dir in runs.items():
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
               "2", "-m", "sparse2d.train", "--config", "configs/tiny_cpu.yaml",
               f"run_dir={run_dir}", *common, *extra[name]]  # fmt: skip
        done = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"),
                              capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    return runs
