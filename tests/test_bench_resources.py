"""Smoke tests of bench/resources_bench.py and bench/suite_bench.py (no timing asserted)."""

from __future__ import annotations

import argparse
import time

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
from resources_bench import constructions, idle_cost, markdown
from suite_bench import BusySampler
from suite_bench import markdown as suite_markdown


def test_resources_bench_small(world4) -> None:
    idle = world4.run(idle_cost, 3, 0.1)[0]
    assert idle["threads_held"] >= idle["threads_destroyed"] + 6  # the groups went
    closed = world4.run(constructions, 2, True)[0]
    kept = world4.run(constructions, 2, False)[0]
    assert closed[0] == closed[1]
    assert kept[1][0] > kept[0][0]  # a model kept open holds its groups
    args = argparse.Namespace(machine="test", seconds=0.1, constructions=2)
    text = markdown({"idle": [idle], "closed": closed, "kept_open": kept}, args)
    assert "| 3 |" in text and "`close()` after each" in text


def test_suite_bench_table() -> None:
    run = {
        "run": 1,
        "commit": "abc1234",
        "total_s": 600.0,
        "pytest_s": 540.2,
        "summary": "400 passed in 540.2s",
        "load_before": 0.1,
        "load_after": 2.0,
        "peak_worker_threads": 40,
        "thread_samples": 900,
        "returncode": 0,
    }
    text = suite_markdown([run, {**run, "run": 2, "cores_busy": 0.964}])
    assert "| 1 | `abc1234` | 10.0 min (600 s) | 540.2 s | 400 passed in 540.2s |" in text
    assert "| 0.1 -> 2.0 | - | 40 (900 samples) | 0 |" in text  # a run kept from before
    assert "| 0.1 -> 2.0 | 96% | 40 (900 samples) | 0 |" in text


def test_busy_sampler_reads_a_share() -> None:
    sampler = BusySampler()
    end = time.monotonic() + 0.2
    while time.monotonic() < end:  # this core busy for 20 jiffies
        pass
    assert 0.0 < sampler.stop() <= 1.0
