"""One-iteration smoke test of bench/fold_bench.py (no timing asserted)."""

from __future__ import annotations

import argparse

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
from fold_bench import _markdown, fold_rank


def test_fold_bench_one_size(world4) -> None:
    r = world4.run(fold_rank, [64], 1)[0]
    (row,) = r["rows"]
    assert row["region_kb"] == 64
    assert row["separate"]["median"] > 0 and row["folded"]["median"] > 0
    args = argparse.Namespace(reps=1, machine="test")
    assert "| 0.0625 MB |" in _markdown(r, args, 1.0)
