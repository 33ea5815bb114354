"""``sharding_group_size="auto"``: the advisor's L, identical on every rank; errors on every rank."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torchrec.optim import RowWiseAdagrad

from sparse2d import DMPCollection, TrialOptions
from sparse2d.advisor.auto_pick import topology_for_device, workload_from_module
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


def check_auto() -> tuple[int, int]:
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
    model = DMPCollection(
        build_model(MIXED_TABLES),
        "auto",
        device="cpu",
        constraints=constraints_for(MIXED_TABLES),
        planner_batch_size=32,
        auto_options=TrialOptions(candidates=0),  # the model's pick alone (no trial)
    )
    return model.sharding_group_size, expected


def check_auto_without_fit() -> str:
    huge = (Table("huge", 10**10, 64, "row_wise"),)
    try:
        DMPCollection(build_model(huge, device="meta"), "auto", device="cpu")
    except PlanError as error:
        return str(error)
    return "constructed"


def test_auto_picks_the_advisors_group_size_on_every_rank(world4) -> None:
    results = world4.run(check_auto, timeout=600)  # every rank plans too: slow on a busy box
    assert len({got for got, _ in results}) == 1
    assert all(got == expected for got, expected in results)


def test_auto_without_a_fit_raises_the_fixes_on_every_rank(world4) -> None:
    for message in world4.run(check_auto_without_fit, timeout=600):
        assert "No sharding group size fits" in message and "1. use at least" in message


def test_cpu_topology_carries_this_hosts_cores() -> None:
    import os

    topo = topology_for_device(torch.device("cpu"), 8)
    assert topo.cores_per_host == (os.cpu_count() or 1)
    assert topo.name == "cpu_gloo" and topo.world_size == 8
