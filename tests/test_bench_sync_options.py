"""bench/sync_options_bench.py: how its stored run renders, and that the options it retired
stay unmeasurable (the runs themselves are the trainer's, tested in tests/test_train.py)."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import pytest

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
from sync_options_bench import CLUSTER, DEFAULT, RETIRED_SETTINGS, SETTINGS, markdown

from sparse2d import KeyValueError, SyncOptions
from sparse2d.errors import ConfigError
from sparse2d.train.config import load_config

ROOT = Path(__file__).resolve().parent.parent
STORED = ROOT / "bench" / "results" / "sync_options.json"


def _table(text: str) -> dict[tuple[str, str], dict[str, str]]:
    """The rendered table's rows by (every, setting), each cell by its column's header."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:  # past the header and the alignment row
        row = dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")), strict=True))
        rows[row["every"], row["setting"]] = row
    return rows


def _mean_samples_per_s(runs: list[dict]) -> float:
    """A setting's samples/s as the stored JSON holds it: the mean over its rounds that ran."""
    return statistics.mean(run["samples_per_s"] for run in runs if "error" not in run)


def test_the_stored_run_renders_every_setting_its_ratio_and_the_verdict() -> None:
    result = json.loads(STORED.read_text())
    args = argparse.Namespace(machine=result["machine"], eval_batches=result["eval_batches"])
    text = markdown(result, args, result["wall_s"])
    rows = _table(text)
    for every in ("1", "10"):
        shown = {name: f"{name} (retired)" for name in RETIRED_SETTINGS}  # their evidence
        names = [name for e, name in rows if e == every]
        assert names == [*SETTINGS, *shown.values()], (every, names)
        base = _mean_samples_per_s(result["runs"][every][DEFAULT])
        for name, runs in result["runs"][every].items():
            mine = _mean_samples_per_s(runs)
            row = rows[every, shown.get(name, name)]
            assert row["samples/s"] == f"{mine:.0f}", (every, name, row)
            assert row["x default"] == f"{mine / base:.2f}", (every, name, row)
    assert "Reproduce: `PYTHONPATH=. .venv/bin/python bench/sync_options_bench.py" in text
    assert "**`overlap`**" in text and "**`compression: bf16`**" in text


def test_the_cluster_figures_come_from_the_cluster_run() -> None:
    """The verdict's cluster ratios are the stored cluster-options run's, computed: a run
    with overlap at half of ``auto``'s samples/s reads 0.50x."""
    result = json.loads(STORED.read_text())
    cluster = json.loads(CLUSTER.read_text())
    args = argparse.Namespace(machine=result["machine"], eval_batches=result["eval_batches"])
    assert "0.92x `auto` at 100mbit and 0.85x `auto` at 1gbit" in markdown(result, args, 1.0)
    for cell in cluster["cells"]:
        if cell["strategy"].get("switch") == "overlap" and cell["link"] == "100mbit":
            auto = next(
                c
                for c in cluster["cells"]
                if c["link"] == "100mbit" and c["label"] == "L=4 inter every 20 auto"
            )
            base = sum(r["samples_per_s"] for r in auto["runs"]) / len(auto["runs"])
            for run in cell["runs"]:
                run["samples_per_s"] = base / 2
    assert "0.50x `auto` at 100mbit" in markdown(result, args, 1.0, cluster)


@pytest.mark.parametrize("overrides", [list(v) for v in RETIRED_SETTINGS.values()])
def test_a_retired_setting_is_refused_in_one_line(overrides: list[str]) -> None:
    with pytest.raises(ConfigError, match=r"was retired: .*sync-options") as info:
        load_config(str(ROOT / "configs" / "tiny_cpu.yaml"), overrides)
    assert "\n" not in str(info.value)
    with pytest.raises(KeyValueError, match="overlap was retired"):
        SyncOptions(overlap=True)  # type: ignore[call-arg]
