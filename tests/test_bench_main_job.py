"""One-iteration smoke test of bench/main_job_bench.py: two trainer steps, real launcher."""

from __future__ import annotations

import argparse

import pytest

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
from main_job_bench import _markdown, measure


@pytest.mark.slow
def test_main_job_bench_two_steps() -> None:
    settings = {"1D (L=4)": ["parallel.sharding_group_size=4"], "2D (L=2)": []}
    results = measure(settings, 2, 1)
    for runs in results.values():
        assert len(runs) == 1 and runs[0]["samples_per_s"] > 0, runs
    assert results["1D (L=4)"][0]["sync_bytes_per_step"] == 0
    assert results["2D (L=2)"][0]["sync_bytes_per_step"] > 0
    assert results["2D (L=2)"][0]["sync_modes"], results  # engine auto reports its choices
    args = argparse.Namespace(steps=2, rounds=1, machine="test")
    assert "2D (default) / 1D" in _markdown(results, args, 1.0)
