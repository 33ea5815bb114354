"""One-iteration smoke test of bench/overhead_bench.py (no timing asserted)."""

from __future__ import annotations

import argparse

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
from overhead_bench import _markdown, overhead_rank


def test_overhead_one_block(world4) -> None:
    results = world4.run(overhead_rank, 1, 1)
    r = results[0]
    assert r["ratio"] > 0 and len(r["per_block_ratio"]) == 1, r
    assert r["min_ratio"] > 0 and r["paired_median_ratio"] > 0, r
    assert "Ours / torchrec" in _markdown(
        r, argparse.Namespace(blocks=1, steps=1, machine="test"), 1.0
    )
