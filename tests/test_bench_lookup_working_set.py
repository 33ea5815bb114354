"""Smoke test of bench/lookup_working_set.py (no timing asserted)."""

from __future__ import annotations

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
from lookup_working_set import median_ms


def test_median_ms_runs_fbgemm_and_counts_ids() -> None:
    ms, ids = median_ms(tables=2, batch=16, rows=50, dim=8, reps=2)
    assert ms > 0 and 32 <= ids <= 96  # 2 x 16 bags of 1-3 ids
