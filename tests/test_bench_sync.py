"""bench/sync_bench.py: its stored run renders, the retired options' rows marked as the
evidence of their retirement; a new run (which cannot measure them) renders without them."""

from __future__ import annotations

import json

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
from sync_bench import STORED, render


def test_the_stored_run_renders_its_ratios_and_marks_the_retired_rows() -> None:
    text = render(json.loads(STORED.read_text()))
    assert text.splitlines()[0] == "## Sync cost vs raw all-reduce (bench/sync_bench.py)"
    assert (
        "| policy dense fp32 (gather + all-reduce + scatter) | 52.0 MB | 0.0808 | 0.54 | 1.16 |"
        in text
    )
    assert "| policy bf16 deltas (retired) | 26.0 MB | 0.5311 | 3.54 | 7.64 |" in text
    assert (
        "| overlap (retired): steps between syncs |" in text
        and "| 1 | 0.0488 | 0.1147 | -0.42 |" in text
    )
    assert "Rows marked (retired)" in text


def test_a_new_run_has_no_retired_rows() -> None:
    run = {
        "rows": 10,
        "dim": 4,
        "tables": 2,
        "repeats": 1,
        "worst": {"raw": 0.2, "flat": 0.1, "dense": 0.1},
        "bytes": {"raw": 1e6, "flat": 1e6, "dense": 1e6},
    }
    text = render(run)
    assert (
        "| policy dense fp32 (gather + all-reduce + scatter) | 1.0 MB | 0.1000 | 0.50 | 1.00 |"
        in text
    )
    assert "retired" not in text
