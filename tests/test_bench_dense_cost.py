"""bench/dense_cost.py: it times the dense part the advisor prices (the same parameters as
``dense_params`` of the config it names), and ``cpu_gloo``'s ``dense_flops`` comment points at
its stored measurement (no timing asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
from dense_cost import step_seconds

ROOT = Path(__file__).resolve().parent.parent


def test_it_times_the_dense_parameters_the_advisor_prices() -> None:
    from sparse2d.train.advisor_workload import dense_params
    from sparse2d.train.config import load_config

    params, times = step_seconds(26, reps=2)
    assert params == dense_params(load_config(str(ROOT / "configs" / "cluster_cpu.yaml")))
    assert len(times) == 2 and min(times) > 0


def test_cpu_gloo_cites_the_stored_dense_measurement() -> None:
    """``cpu_gloo`` keeps 2e9 (it stands in for per-step work the model has no term for, with
    the emulated hosts' fitted core share), not the measured rate: its comment says so and
    where the measurement is, and that measurement is stored and rendered."""
    preset = (ROOT / "sparse2d" / "advisor" / "presets" / "cpu_gloo.yaml").read_text()
    lines = preset.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("dense_flops:"))
    comment = " ".join(lines[start : start + 8])
    assert "bench/dense_cost.py" in comment and "dense-cost" in comment
    stored = json.loads((ROOT / "bench" / "results" / "dense_cost.json").read_text())
    assert stored["rate"] > 0 and stored["rows"]
    results = (ROOT / "bench" / "RESULTS.md").read_text()
    assert "<!-- dense-cost:begin -->" in results
