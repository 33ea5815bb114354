"""``sparse2d plan`` on every shipped config: the table, the recommendation, JSON, no-fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparse2d.advisor.search import advise
from sparse2d.advisor.topology import byte_text
from sparse2d.train.advisor_command import topology_for, workload_from_config
from sparse2d.train.cli import main as cli
from sparse2d.train.config import load_config

CONFIGS = sorted(Path(__file__).resolve().parents[1].glob("configs/*.yaml"))
WORLD = {"dlrm_large_1024gpu": 256}  # the large config: fewer divisors keep the test short


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_plan_prints_the_table_and_a_recommendation(path: Path, capsys) -> None:
    world = WORLD.get(path.stem, 8)
    assert cli(["plan", "--config", str(path), "--world-size", str(world)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"sharding group size advisor: world {world}")
    assert "recommended: sharding_group_size=" in out
    cfg = load_config(str(path))
    workload = workload_from_config(cfg)
    topology = topology_for(cfg, world)
    for c in advise(workload, topology).candidates:
        assert c.memory_per_rank_bytes >= workload.weight_bytes / c.sharding_group_size
        if workload.weight_bytes / c.sharding_group_size > topology.device_memory_bytes:
            assert not c.fits


def test_plan_json_is_one_object(capsys) -> None:
    assert cli(["plan", "--config", "configs/tiny_cpu.yaml", "--world-size", "4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["world_size"] == 4 and data["recommended"] in (1, 2, 4)
    assert [c["sharding_group_size"] for c in data["candidates"]] == [1, 2, 4]


def test_plan_in_worker_processes_answers_the_same(capsys) -> None:
    """``--jobs 2`` plans the candidate L in two forked processes: the same advice as one."""
    args = ["plan", "--config", "configs/tiny_cpu.yaml", "--world-size", "8", "--json"]
    assert cli([*args, "--jobs", "1"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert cli([*args, "--jobs", "2"]) == 0
    assert json.loads(capsys.readouterr().out) == alone
    assert cli([*args, "--jobs", "0"]) == 1
    assert "--jobs 0 must be >= 1" in capsys.readouterr().err


def test_plan_memory_column_picks_its_unit(capsys) -> None:
    """The tiny config's tables are a few MiB per rank: the column says so (it printed
    ``0.00GiB``), in the column's width, and ``byte_text`` picks the unit by size."""
    assert cli(["plan", "--config", "configs/tiny_cpu.yaml", "--world-size", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if line.split()[0] in ("1", "2", "4") and "ms" in line]
    assert len(rows) == 3 and "0.00GiB" not in "".join(rows), rows
    assert all(r[13:23].strip().endswith(("KiB", "MiB")) for r in rows), rows  # its column
    assert [byte_text(n) for n in (640, 1600, 5 * 2**20, 98.15 * 2**30)] == [
        "640B",
        "1.56KiB",
        "5.00MiB",
        "98.15GiB",
    ]


def test_plan_without_a_fit_exits_1_with_fixes(capsys) -> None:
    args = ["plan", "--config", "configs/tiny_cpu.yaml", "--set", "device_memory_bytes=1000"]
    assert cli(args) == 1
    captured = capsys.readouterr()
    assert "recommended:" not in captured.out and " NO" in captured.out
    assert "No sharding group size fits" in captured.err and "1. use at least" in captured.err


def test_plan_rejects_bad_input(capsys) -> None:
    assert cli(["plan", "--config", "configs/tiny_cpu.yaml", "--topology", "tpu"]) == 1
    assert "neither a preset" in capsys.readouterr().err


def test_plan_fully_sharded_splits_weights(capsys) -> None:
    # sparse2d's FULLY_SHARDED runs on CPU/gloo too, so a CPU topology is advised, not refused
    tiny = ["plan", "--config", "configs/tiny_cpu.yaml", "--sharding-strategy", "fully_sharded"]
    assert cli(tiny) == 0
    assert "recommend" in capsys.readouterr().out.lower()
    base = ["plan", "--config", "configs/dlrm_criteo_1host_8gpu.yaml", "--json"]
    assert cli(base) == 0
    default = json.loads(capsys.readouterr().out)["candidates"]
    assert cli([*base, "--sharding-strategy", "fully_sharded"]) == 0
    split = json.loads(capsys.readouterr().out)["candidates"]
    # L=1: every rank holds all weights; FULLY_SHARDED keeps 1/8 of them (G=8)
    assert split[0]["memory_per_rank_bytes"] < default[0]["memory_per_rank_bytes"] / 4
    assert split[-1]["memory_per_rank_bytes"] == default[-1]["memory_per_rank_bytes"]  # G=1


def test_plan_prints_types_and_terms_and_explains_a_loser(capsys) -> None:
    args = ["plan", "--config", "configs/tiny_cpu.yaml", "--world-size", "4", "--explain", "4"]
    assert cli(args) == 0
    out = capsys.readouterr().out
    assert "sharding types" in out and "TW:6" in out  # tiny_cpu: 6 table-wise tables
    assert "terms per step (ms): compute, output_a2a, input_a2a, sync" in out
    assert "L=4 (TW:6) vs recommended L=" in out and "output_a2a" in out.split("vs recommended")[1]


def test_plan_qcomm_lowers_the_all_to_all_and_bad_values_are_named(capsys) -> None:
    base = ["plan", "--config", "configs/tiny_cpu.yaml", "--world-size", "4", "--json"]
    assert cli(base) == 0
    fp32 = json.loads(capsys.readouterr().out)["candidates"][-1]["terms"]["output_a2a"]
    assert cli([*base, "--qcomm", "fp16,bf16"]) == 0
    fp16 = json.loads(capsys.readouterr().out)["candidates"][-1]["terms"]["output_a2a"]
    assert fp16 < fp32
    assert cli([*base, "--qcomm", "fp4"]) == 1
    assert "qcomm_forward='fp4'" in capsys.readouterr().err
    assert cli([*base[:-1], "--explain", "3"]) == 1
    assert "--explain 3: not a candidate" in capsys.readouterr().err


def test_plan_forecast_prices_the_given_worlds_on_the_same_terms(capsys) -> None:
    """``--forecast``: 1D and the best L at each world given, from the same cost model as the
    plan itself (the world of the plan gives the plan's own candidate), on hosts of 4 ranks
    and a shaped link: 1D's bytes across a host's link grow with the hosts, its link bound is
    the link's rate over them (catches a forecast priced at the plan's world, or bytes and
    bounds taken from another candidate)."""
    base = ["plan", "--config", "configs/cluster_cpu.yaml", "--world-size", "8", "--json"]
    link = ["--set", "ranks_per_host=4", "--set", "host_link_bw=25000000"]
    assert cli([*base, *link, "--forecast", "8,32"]) == 0
    data = json.loads(capsys.readouterr().out)
    own = {c["sharding_group_size"]: c for c in data["candidates"]}
    small, large = data["forecast"]
    assert (small["world_size"], large["world_size"]) == (8, 32)
    assert small["1d"]["step_s"] == pytest.approx(own[8]["step_s"])
    assert small["best"]["sharding_group_size"] == data["recommended"]
    assert small["1d"]["host_link_bytes_per_step"] == pytest.approx(own[8]["host_link_bytes"])
    assert large["1d"]["host_link_bytes_per_step"] > 1.5 * small["1d"]["host_link_bytes_per_step"]
    assert large["1d"]["link_bound_per_rank"] == pytest.approx(
        512 * 25e6 / large["1d"]["host_link_bytes_per_step"]
    )
    assert cli([*base[:-1], *link, "--forecast", "32"]) == 0
    assert "| 32 |" in capsys.readouterr().out.split("Forecast")[1]
    with pytest.raises(SystemExit) as refused:
        cli([*base, "--forecast", "0,8"])
    assert refused.value.code == 2
    assert "give world sizes >= 1" in capsys.readouterr().err
