"""bench/cluster_bench.py: the strategies it runs and how a measurement renders (the runs
themselves go through launch/emulated_hosts.sh, tested in tests/test_emulated_hosts.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
from cluster_bench import MARKERS, Strategy, main, strategies
from cluster_report import plot, render, retired_option, title


def test_every_layout_once_and_the_options_crossed() -> None:
    plan = strategies(8, [1, 10], ["dense", "sparse"], auto=["model"])
    labels = [s.label(8) for s in plan]
    assert len(labels) == len(set(labels))
    assert labels[0] == "1D" and sum(s.group_size == 8 for s in plan) == 1
    # L=1 has one layout; L=2, 4 both
    assert {s.layout for s in plan if s.group_size == 1} == {"inter_host"}
    assert {s.layout for s in plan if s.group_size in (2, 4)} == {"intra_host", "inter_host"}
    fixed = [s for s in plan if not s.auto and s.group_size != 8]
    assert len(fixed) == (1 + 2 + 2) * 2 * 2  # L=1, 2x2, 2x4 layouts; every; engines
    assert [s.every for s in plan if s.auto] == [1, 10]
    assert "parallel.replica_layout=auto" in Strategy(0, auto="model").overrides()
    assert not any("parallel.auto." in o for o in Strategy(0, auto="model").overrides())
    with pytest.raises(ValueError, match="retired"):  # a new run cannot pose as the trial
        strategies(8, [1], ["dense"], auto=["measured"])


def _cell(label: str, group: int, sps: list[float], **extra) -> dict:
    runs = [
        {
            "samples_per_s": v,
            "step_s": 1024 / v,
            "eval_auc": 0.8,
            "sharding_group_size": group,
            "replica_layout": "inter_host",
            "host_link_bytes_per_step": 1e6 * group,
            "predicted_step_s": 1024 / v * 1.2,
        }
        for v in sps
    ]
    strategy = {"group_size": group, "auto": extra.pop("auto", "")}
    return {
        "hosts": 2,
        "nproc": 2,
        "link": "100mbit",
        "label": label,
        "strategy": strategy,
        "runs": runs,
        **extra,
    }


def test_render_ranks_against_1d_and_judges_the_advisor(tmp_path: Path) -> None:
    result = {
        "config": "configs/cluster_cpu.yaml",
        "steps": 10,
        "rounds": 2,
        "overrides": [],
        "machine": "2 cores",
        "cells": [
            _cell("1D", 4, [100.0, 110.0]),
            _cell("L=2 inter every 10 auto", 2, [200.0, 220.0]),
            _cell("auto (measured) every 10 auto", 2, [190.0, 200.0], auto="measured"),
            {**_cell("L=1 every 10 auto", 1, []), "runs": [{"error": "rc 1: boom", "wall_s": 1.0}]},
        ],
    }
    text = render(result)
    rows = [line for line in text.splitlines() if line.startswith("| ")][1:]
    assert rows[0].startswith("| L=2 inter every 10 auto | 210 | 200, 220 | 2.00 |")
    assert "auto (measured) every 10 auto: L=2 inter_host" in rows[1]
    assert "| 1D | 105 | 100, 110 | 1.00 |" in text
    assert "the best fixed strategy (L=2 inter every 10 auto) is 1.08x its samples/s" in text
    assert "mean absolute error of the predicted step 20%" in text
    assert "L=1 every 10 auto failed: rc 1: boom" in text
    plot(result, tmp_path / "cluster.png")
    assert (tmp_path / "cluster.png").stat().st_size > 1000


STORED = Path(__file__).resolve().parent.parent / "bench" / "results"


@pytest.mark.parametrize("preset", sorted(MARKERS, key=str))
def test_every_stored_run_renders_and_prices_again(preset: str | None, tmp_path: Path) -> None:
    """``--render --repredict`` on each stored cluster JSON (older runs' keys included):
    its own title, a path relative to the repository, retired options' rows marked."""
    name = f"cluster_{preset}" if preset else "cluster"
    for file in (f"{name}.json", "environment.json"):
        shutil.copy(STORED / file, tmp_path / file)
    assert (
        main(
            [
                "--render",
                "--repredict",
                "--out",
                str(tmp_path),
                *(["--preset", preset] if preset else []),
            ]
        )
        == 0
    )
    text = (tmp_path / "RESULTS.md").read_text()
    heading = [line for line in text.splitlines() if line.startswith("## ")]
    assert heading == [title(json.loads((STORED / f"{name}.json").read_text()), preset)]
    assert "/work/" not in text and "`/" not in text
    result = json.loads((tmp_path / f"{name}.json").read_text())
    assert all(
        r.get("predicted_step_s") for c in result["cells"] for r in c["runs"] if "error" not in r
    )
    retired = [c for c in result["cells"] if retired_option(c["strategy"])]
    for cell in retired:
        assert f"| {cell['label']} (retired) |" in text
    assert ("Rows marked (retired)" in text) == bool(retired)


def test_stored_strategies_read_with_their_retired_switches() -> None:
    assert Strategy.from_stored({"group_size": 4, "bf16": True}).switch == "compression=bf16"
    old = Strategy.from_stored({"group_size": 4, "bf16": False, "switch": "overlap"})
    assert old.switch == "overlap=true" and old.retired
    assert not Strategy.from_stored({"group_size": 4, "switch": "hide=false"}).retired


def test_titles_differ_by_what_the_runs_compare() -> None:
    titles = {
        preset: title(
            json.loads(
                (
                    STORED / f"cluster_{preset}.json" if preset else STORED / "cluster.json"
                ).read_text()
            ),
            preset,
        )
        for preset in MARKERS
    }
    assert len(set(titles.values())) == len(titles), titles


def test_bounds_put_each_step_against_the_larger_of_compute_and_link() -> None:
    burst = {"group_size": 2, "every": 20, "engine": "auto", "switch": ""}
    stream = {**burst, "switch": "stream=true"}

    def cell(label: str, strategy: dict, link: str, sps: float, nbytes: float, auc: float):
        run = {
            "samples_per_s": sps,
            "step_s": 1024 / sps,
            "eval_auc": auc,
            "sharding_group_size": strategy["group_size"],
            "host_link_bytes_per_step": nbytes,
        }
        return {
            "hosts": 2,
            "nproc": 2,
            "link": link,
            "label": label,
            "strategy": strategy,
            "runs": [run],
        }

    burst_label, stream_label = "L=2 inter every 20 auto", "L=2 inter every 20 auto stream=true"
    result = {
        "config": "configs/cluster_cpu.yaml",
        "steps": 300,
        "rounds": 1,
        "overrides": [],
        "machine": "2 cores",
        "cells": [
            cell("1D", {"group_size": 4}, "100mbit", 1024.0, 4e6, 0.70),
            cell(burst_label, burst, "100mbit", 2048.0, 2.5e6, 0.80),
            cell(stream_label, stream, "100mbit", 4096.0, 2.5e6, 0.801),
            # unshaped: the compute bounds, 100 ms and 200 ms
            cell(burst_label, burst, "none", 10240.0, 2.5e6, 0.8),
            cell(stream_label, stream, "none", 5120.0, 2.5e6, 0.8),
        ],
    }
    text = render(result, "stream")
    # link bound: 2.5 MB over 2 hosts at 12.5 MB/s = 100 ms; the stream's compute bound 200 ms
    assert f"| {stream_label} | 250 | 200 | 100 | 1.25 |" in text
    assert f"| {burst_label} | 500 | 100 | 100 | 5.00 |" in text
    assert f"- {stream_label}: 2.00x the burst sync ({burst_label}) in samples/s" in text
    assert f"- {stream_label}: 4.00x 1D (1D) in samples/s; eval AUC +0.1010" in text
