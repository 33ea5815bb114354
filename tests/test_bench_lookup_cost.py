"""bench/lookup_cost.py: the FBGEMM step runs and counts what it touched; the per-id and
per-row fit recovers known costs (no timing asserted)."""

from __future__ import annotations

import pytest

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
from lookup_cost import fit_per_id_and_row, median_ms


def test_median_ms_runs_fbgemm_and_counts_ids_and_rows() -> None:
    ms, ids, distinct = median_ms(tables=2, batch=16, rows=50, dim=8, reps=2)
    assert ms > 0 and 32 <= ids <= 96  # 2 x 16 bags of 1-3 ids
    assert 2 <= distinct <= min(ids, 100)  # 2 tables of 50 rows


def test_fit_recovers_per_id_and_per_row_costs() -> None:
    points = [
        (ids, rows, (ids * 3e-8 + rows * 5e-7) * 1e3)
        for ids, rows in ((1000, 900), (4000, 1000), (16000, 15000), (64000, 8000))
    ]
    per_id, per_row, error = fit_per_id_and_row(points)
    assert per_id == pytest.approx(3e-8, rel=1e-6)
    assert per_row == pytest.approx(5e-7, rel=1e-6)
    assert error < 1e-9


def test_concurrent_processes_each_report_their_cost() -> None:
    from lookup_cost import concurrent_us_per_id

    assert concurrent_us_per_id(procs=2, rows=100, reps=1) > 0
