"""``sharding_group_size="auto"``: the cost model's L, identical on every rank; errors on every
rank; the retired trial's options refused before any collective."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torchrec.optim import RowWiseAdagrad

from sparse2d import DMPCollection, KeyValueError, pick_group_size
from sparse2d.advisor.auto_pick import AutoPick, topology_for_device, workload_from_module
from sparse2d.advisor.search import recommend_group_size
from sparse2d.errors import PlanError
from tests.models import MIXED_TABLES, Table, build_model, constraints_for


def test_workload_is_read_off_a_meta_model() -> None:
    model = build_model(MIXED_TABLES, optimizer=RowWiseAdagrad, device="meta")
    w = workload_from_module(model, 64, None, "intra_host", constraints_for(MIXED_TABLES))
    assert [(t.name, t.rows, t.dim, t.sharding) for t in w.tables] == [
        (t.name, t.rows, t.dim, t.sharding) for t in MIXED_TABLES
    ]
    assert w.optimizer == "rowwise_adagrad" and w.batch_size_per_rank == 64
    assert w.dense_params == sum(p.numel() for n, p in model.named_parameters() if "ebc" not in n)


def check_auto() -> tuple[int, int, int]:
    expected = recommend_group_size(
        workload_from_module(
            build_model(MIXED_TABLES, device="meta"),
            32,
            None,
            "intra_host",
            constraints_for(MIXED_TABLES),
        ),
        topology_for_device(torch.device("cpu"), dist.get_world_size()),
    )
    kwargs = dict(device="cpu", constraints=constraints_for(MIXED_TABLES), planner_batch_size=32)
    picked = pick_group_size(build_model(MIXED_TABLES, device="meta"), **kwargs)
    model = DMPCollection(build_model(MIXED_TABLES), "auto", **kwargs)
    return model.sharding_group_size, picked, expected


def check_auto_without_fit() -> str:
    huge = (Table("huge", 10**10, 64, "row_wise"),)
    try:
        DMPCollection(build_model(huge, device="meta"), "auto", device="cpu")
    except PlanError as error:
        return str(error)
    return "constructed"


def test_auto_picks_the_advisors_group_size_on_every_rank(world4) -> None:
    results = world4.run(check_auto, timeout=600)  # every rank plans too: slow on a busy box
    assert len({got for got, _, _ in results}) == 1
    assert all(got == picked == expected for got, picked, expected in results)


def test_auto_without_a_fit_raises_the_fixes_on_every_rank(world4) -> None:
    for message in world4.run(check_auto_without_fit, timeout=600):
        assert "No sharding group size fits" in message and "1. use at least" in message


def test_cpu_topology_carries_this_hosts_cores() -> None:
    import os

    topo = topology_for_device(torch.device("cpu"), 8)
    assert topo.cores_per_host == (os.cpu_count() or 1)
    assert topo.name == "cpu_gloo" and topo.world_size == 8


@pytest.mark.parametrize("call", ["door", "pick"])
def test_the_retired_trial_options_are_refused_before_any_collective(call: str) -> None:
    """``auto_options`` configured the measured trial (retired, issue 66): refused naming it
    and the stored runs, before the process group is even looked for (none exists here)."""
    module = build_model(MIXED_TABLES, device="meta")
    with pytest.raises(KeyValueError, match=r"^auto_options was retired: .*section auto"):
        if call == "door":
            DMPCollection(module, 2, auto_options=object())
        else:
            pick_group_size(module, auto_options=object())


def test_the_log_line_says_the_model_picked_and_its_predicted_steps() -> None:
    pick = AutoPick(2, "intra_host", {4: 0.0152, 1: 0.0566, 2: 0.0341})
    assert pick.line() == (
        "auto sharding_group_size=2 (intra_host): the cost model's pick; predicted step "
        "L=1 56.6 ms, L=2 34.1 ms, L=4 15.2 ms"
    )
    assert pick.as_json()["method"] == "model"
    assert list(pick.as_json()["predicted_step_s"]) == ["1", "2", "4"]
