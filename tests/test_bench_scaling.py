"""bench/scaling_bench.py: its cells, how a measurement renders and judges, and one real cell
(the smallest: 2 emulated hosts, root only) whose interface counters the model's bytes
must match."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
from scaling_bench import (
    acceptance,
    counted_syncs,
    figures,
    main,
    plan,
    render,
    ring_factor,
    workload_overrides,
)


def _args(**kw: object) -> object:
    import argparse

    base = dict(
        sizes=[2, 4, 8],
        nproc=4,
        link="200mbit",
        steps=40,
        workloads=["fixed", "growing"],
        strategies=["1d", "2d", "rep"],
        every=20,
        engine="auto",
    )
    base.update(kw)
    return argparse.Namespace(**base)


def test_cells_are_dilated_and_the_growing_tables_grow_with_the_hosts() -> None:
    cells = plan(_args())
    assert len(cells) == 3 * 2 * 3
    eight = [c for c in cells if c["hosts"] == 8 and c["workload"] == "fixed"]
    assert {c["link"] for c in eight} == {"50000000bit"} and eight[0]["dilation"] == 4.0
    assert [c["strategy"].group_size for c in eight] == [32, 4, 1]
    assert {c["strategy"].layout for c in eight} == {"inter_host"}
    assert [c["label"] for c in eight][0] == "1D"
    assert workload_overrides("configs/cluster_cpu.yaml", "fixed", 8) == []
    assert workload_overrides("configs/cluster_cpu.yaml", "growing", 8) == [
        "model.tables.0.count=104"
    ]
    with pytest.raises(ValueError, match="multiple of 2"):
        workload_overrides("configs/cluster_cpu.yaml", "growing", 3)


def _cell(
    hosts: int, kind: str, sps: float, nbytes: float, model_bytes: float, step_err=1.0, sync=0.0
):
    world = hosts * 4
    run = {
        "samples_per_s": sps,
        "step_s": 2048 * hosts / 2 / sps,
        "host_link_bytes_per_step": nbytes * hosts,
        "sync_s_per_step": 0.01,
        "peak_rss_bytes": 4e8,
        "predicted": {
            "step_s": 2048 * hosts / 2 / sps * step_err,
            "terms": {
                "compute": 0.1,
                "output_a2a": 0.2,
                "input_a2a": 0.0,
                "dense_allreduce": 0.0,
                "overhead": 0.0,
                "sync": 0.01,
            },
            "host_link_bytes": model_bytes,
            "host_link_terms": {"sync": sync},
            "state_per_rank_bytes": 2e7,
        },
    }
    return {
        "hosts": hosts,
        "nproc": 4,
        "link": "x",
        "dilation": hosts / 2,
        "workload": "fixed",
        "kind": kind,
        "label": "1D" if kind == "1d" else "L=4 inter every 20 auto",
        "strategy": {
            "group_size": world if kind == "1d" else 4,
            "layout": "inter_host",
            "every": 20,
        },
        "steps": 40,
        "runs": [run],
    }


def test_the_sync_of_the_last_step_is_not_counted() -> None:
    """The trainer stops counting before the sync started at the last step lands."""
    assert counted_syncs(40, 20) == 0.5 and counted_syncs(100, 20) == 0.8
    assert counted_syncs(41, 20) == pytest.approx(2 / (41 / 20))
    assert counted_syncs(10, 1) == pytest.approx(0.9)


def test_a_run_that_counted_the_last_sync_is_compared_at_the_steady_state() -> None:
    """Runs that landed the last step's sync while counting (``host_link_landing_bytes``)
    compare with the model's own bytes per step, their step still at the syncs timed; runs
    before that at the syncs counted. Catches the last sync taken off twice (or never)."""
    old = _cell(8, "2d", 2600, 5.2e6, 7.9e6, sync=5.4e6)
    assert figures(old)["predicted_bytes_per_host"] == pytest.approx(7.9e6 - 2.7e6)
    new = _cell(8, "2d", 2600, 7.6e6, 7.9e6, sync=5.4e6)
    new["runs"][0].update(host_link_landing_bytes=8e8, host_link_packets_per_step=20000)
    f = figures(new)
    assert f["predicted_bytes_per_host"] == pytest.approx(7.9e6)
    assert f["predicted_step_s"] == pytest.approx(f["steady_step_s"] - 0.5 * 0.01)
    assert f["framing_per_host"] == pytest.approx(20000 * 66 / 8)


def test_2d_bytes_per_unit_of_the_all_reduce_bound() -> None:
    """2(H-1)/H: 1 at 2 hosts, 1.75 at 8; the acceptance line divides by it."""
    assert ring_factor(2) == 1.0 and ring_factor(8) == 1.75
    cells = [_cell(2, "2d", 10000, 4e6, 4e6), _cell(8, "2d", 2600, 7.7e6, 7.7e6)]
    (line,) = acceptance(json.loads(json.dumps(cells)))[:1]
    assert "Per unit of that bound: 4.00 and 4.40 MB/host/step, 1.10x (flat within 1.2x)" in line


def test_render_converts_to_dilated_seconds_and_judges_every_goal() -> None:
    """Catches the dilation applied the wrong way, bytes not divided by the hosts, or a goal
    judged on the wrong cells."""
    cells = [
        _cell(2, "1d", 5000, 14e6, 14.2e6),
        _cell(2, "2d", 10000, 4e6, 4.6e6, step_err=1.1),
        _cell(8, "1d", 1200, 25e6, 25e6),
        _cell(8, "2d", 2600, 5.2e6, 7.9e6, step_err=1.5, sync=5.4e6),
        {**_cell(4, "1d", 1, 1, 1), "runs": []},
    ]
    result = {
        "config": "configs/cluster_cpu.yaml",
        "steps": 40,
        "link": "200mbit",
        "machine": "2 cores",
        "cells": cells,
    }
    text = render(json.loads(json.dumps(result)))
    assert (
        "| 32 | x | L=4 inter every 20 auto | 1 | 2600 | 10400 | 325 | 5.20 / 5.20 (+0%) [7.90]"
        in text
    )
    lines = acceptance(json.loads(json.dumps(cells)))
    assert lines[0].startswith(
        "- 2D (inter_host, L=4), fixed workload: bytes per host per "
        "step grow 1.30x from 2 to 8 hosts (goal <= 1.2x: **not met**)"
    )
    assert "the model says 1.13x" in lines[0]  # as counted: half of 8 hosts' sync
    assert "grow 1.79x" in lines[1]
    assert "3 of 4 cells; off: 2x4 fixed L=4 inter every 20 auto (15%)." in lines[2]
    assert "Predicted step within 30%: 3 of 4 cells; off: 8x4 fixed L=4" in lines[3]
    assert "(8 hosts): 2D is 2.17x 1D's samples/s (goal >= 2x: met); eval AUC not" in lines[4]
    assert "Not measured (machine time): 4x4 fixed 1D" in lines[5]


@pytest.mark.skipif(
    os.geteuid() != 0, reason="emulated hosts need root (ip netns, bridges, tc); CI runs as root"
)
def test_smallest_cell_counters_match_the_models_bytes(tmp_path: Path) -> None:
    """One real run, 1D on 2 emulated hosts x 2 ranks, a few steps: the bytes the hosts'
    interfaces counted per step per host within 10% of ``Candidate.host_link_bytes`` (a
    dropped backward all-to-all, or bytes per rank instead of per host, is off by 2x), and
    the peak RSS of a rank read."""
    out = tmp_path / "out"
    argv = [
        "--sizes",
        "2",
        "--nproc",
        "2",
        "--workloads",
        "fixed",
        "--strategies",
        "1d",
        "--rounds",
        "1",
        "--steps",
        "6",
        "--timeout",
        "300",
        "--out",
        str(out),
        "--scratch",
        str(tmp_path / "runs"),
        "--no-results-md",
        "--set",
        "data.batch_size_per_rank=256",
    ]
    assert main(argv) == 0
    (cell,) = json.loads((out / "scaling_bench.json").read_text())["cells"]
    (run,) = cell["runs"]
    assert "error" not in run, run
    measured = run["host_link_bytes_per_step"] / 2
    model = run["predicted"]["host_link_bytes"]
    assert model == pytest.approx(measured, rel=0.10), (measured, model)
    assert run["peak_rss_bytes"] > 100 * 2**20
