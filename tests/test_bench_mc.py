"""Smoke test of bench/mc_bench.py's sync-cost measurement and section (no timing asserted)."""

from __future__ import annotations

import argparse

import pytest

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
from mc_bench import measure_sync, section


@pytest.mark.parametrize("kind", ["mch", "zch"])
def test_mc_sync_cost_one_round(world4, kind: str) -> None:
    cost = world4.run(measure_sync, 400, 8, 1, 16, kind)[0]
    plain, mc = cost["plain"], cost["mc"]
    # MC sends its shard's rows + states like the plain table, plus the identity all-gather.
    assert mc["bytes"] > plain["bytes"] > 0
    assert len(plain["seconds"]) == len(mc["seconds"]) == 1
    quality = [
        {"strategy": "1D", "every": None, "eval_auc": 0.8, "sync_s_per_step": 0.0},
        {"strategy": "2D", "every": 16, "eval_auc": 0.799, "sync_s_per_step": 0.01},
    ]
    args = argparse.Namespace(
        steps=1, eval_batches=1, rows=400, dim=8, batch=16, repeats=1, kind=kind
    )
    text = section(quality, cost, args, "test")
    assert "| 2D | 16 | 0.7990 | -0.0010 |" in text and "| mc |" in text
