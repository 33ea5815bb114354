"""One-iteration smoke test of bench/step_breakdown.py (no timing asserted)."""

from __future__ import annotations

import argparse

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
from step_breakdown import PHASES, _markdown, _plot, breakdown_rank


def test_step_breakdown_one_step(world4, tmp_path) -> None:
    results = world4.run(breakdown_rank, [2, 4], 1, 0, 64)
    assert all(r == results[0] for r in results)  # slowest-rank numbers: same on every rank
    rows = results[0]
    assert [(r["world"], r["L"], r["replicas"]) for r in rows] == [(4, 2, 2), (4, 4, 1)]
    for row in rows:
        assert all(row[p]["min"] >= 0 for p in PHASES) and row["step"]["median"] > 0, row
    assert rows[1]["sync"]["max"] < rows[0]["sync"]["max"] or rows[1]["sync"]["max"] < 1e-3
    args = argparse.Namespace(global_batch=64, steps=1, warmup=0, machine="test")
    assert "| 4 | 2 | 2 |" in _markdown(rows, args, 1.0)
    _plot(rows, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0
