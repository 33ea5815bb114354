"""One-iteration smoke test of bench/memory_bench.py: per-rank bytes match total / L."""

from __future__ import annotations

import argparse

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
from memory_bench import DIM, _markdown, memory_rank


def test_memory_bytes_follow_total_over_l(world4) -> None:
    ranks = world4.run(memory_rank, 2, 4, 1000)[0]  # 4 TW tables over L=2: 2 per rank
    for r in ranks:
        assert r["weights"] == 2 * 1000 * DIM * 4, r
        assert r["states"] == 2 * 1000 * 4, r  # row-wise AdaGrad: one fp32 per row
        assert r["weights"] + r["states"] == r["theory"], r
        assert r["tracking"] == 2 * 1000 * 4 and r["peak_rss"] > 0, r
    text = _markdown([ranks], argparse.Namespace(tables=4, rows=1000), 1.0)
    assert "| 2 | 2 |" in text and "1.000" in text
