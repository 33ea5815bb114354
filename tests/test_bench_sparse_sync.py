"""One-iteration smoke test of bench/sparse_sync_bench.py (no timing asserted)."""

from __future__ import annotations

import argparse

import torch.distributed as dist

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
from sparse_sync_bench import FRACTIONS, _run_size, _slowest_rank
from sparse_sync_report import _markdown


def check_one_cell() -> list:
    mine = [_run_size(4000, dist.get_rank(), 1, (1,), 1)]
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return _slowest_rank(every)


def test_sparse_sync_bench_one_cell(world4) -> None:
    results = world4.run(check_one_cell)[0]
    runs, sweep = results[0]["runs"], results[0]["sweep"]
    assert len(runs) == 2 and len(sweep) == len(FRACTIONS)  # uniform + zipf, every=1
    for run in runs:
        assert run["sparse_bytes"] < run["dense_bytes"] and run["auto_s"] > 0, run
    text = _markdown(results, argparse.Namespace(reps=1, ab_reps=1, machine="test"), 1.0)
    assert "auto / best" in text and "| 4e+03 |" in text.split("alternating")[1]
    assert all(len(v) == 1 for v in results[0]["ab"].values()), results[0]["ab"]
