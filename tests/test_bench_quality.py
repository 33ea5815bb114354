"""bench/quality.py: each stored run renders its section, the retired bf16 rows marked as
the evidence of their retirement (the runs themselves are the trainer's)."""

from __future__ import annotations

import json

import pytest

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
from bench_util import RESULTS_DIR
from quality import MARKERS, section


@pytest.mark.parametrize("variant", sorted(MARKERS))
def test_the_stored_run_renders_with_retired_rows_marked(variant: str) -> None:
    suffix = "" if variant == "tiny" else f"_{variant}"
    result = json.loads((RESULTS_DIR / f"quality_results{suffix}.json").read_text())
    text = section(result, variant)
    assert text.startswith(
        f"## Quality: 1D vs 2D sync strategies, {variant} data (bench/quality.py)"
    )
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == len(result["rows"])
    assert all(line.startswith("| bf16 (retired) |") for line in rows if "bf16" in line)
    assert "Rows marked (retired): bf16" in text
    assert f"--variant {variant} --steps {result['steps']}" in text
