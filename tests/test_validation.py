"""Bad input raises the same clear error on every rank, before any collective (no hang)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.optim import _apply_optimizer_in_backward as apply_optimizer_in_backward
from torchrec.distributed.planner.types import ParameterConstraints

from sparse2d import DMPCollection
from sparse2d.errors import ConfigError, PlanError, UnsupportedOptimizerError
from sparse2d.planner.group_plan import _plan_locally
from sparse2d.planner.sharders import default_sharders
from tests.models import MIXED_TABLES, PooledModel, build_model, constraints_for

BAD_INPUTS = {
    "indivisible": ("world_size=4 is not divisible by sharding_group_size=3", ConfigError),
    "zero": ("sharding_group_size=0 is outside 1..4", ConfigError),
    "too_large": ("sharding_group_size=8 is outside 1..4", ConfigError),
    "layout": ("replica_layout='diagonal' is unknown; use one of", ConfigError),
    "no_tables": ("has no module sparse2d can shard", ConfigError),
    "plan_ranks": ("sharding group has 2 ranks (0..1)", PlanError),
    "optimizer": (
        "uses fused optimizer ADAM, which FBGEMM's CPU kernels do not implement",
        UnsupportedOptimizerError,
    ),
    "node_group": ("node_group_size=3 must divide sharding_group_size=2", ConfigError),
    "unplannable": (
        "Planning the embedding tables for a sharding group of 2 ranks failed",
        PlanError,
    ),
}


def _build(case: str) -> None:
    tables = MIXED_TABLES
    if case == "indivisible":
        DMPCollection(build_model(tables), 3, device="cpu")
    elif case == "zero":
        DMPCollection(build_model(tables), 0, device="cpu")
    elif case == "too_large":
        DMPCollection(build_model(tables), 8, device="cpu")
    elif case == "layout":
        DMPCollection(build_model(tables), 2, device="cpu", replica_layout="diagonal")
    elif case == "no_tables":
        DMPCollection(nn.Sequential(nn.Linear(4, 4)), 2, device="cpu")
    elif case == "plan_ranks":
        plan = _plan_locally(
            PooledModel(tables, "meta"), 4, "cpu", default_sharders(), constraints_for(tables), 4, 8
        )
        DMPCollection(build_model(tables), 2, device="cpu", plan=plan)
    elif case == "optimizer":
        model = PooledModel(tables)
        apply_optimizer_in_backward(torch.optim.Adam, model.ebc.parameters(), {"lr": 0.1})
        DMPCollection(model, 2, device="cpu")
    elif case == "unplannable":  # rank 0's planner error reaches every rank
        constraints = {"t0": ParameterConstraints(sharding_types=["data_parallel"])}
        DMPCollection(build_model(tables), 2, device="cpu", constraints=constraints)
    elif case == "node_group":
        DMPCollection(build_model(tables), 2, device="cpu", node_group_size=3)


def check_bad_input(case: str) -> tuple[str, str]:
    try:
        _build(case)
    except ValueError as error:
        caught = (type(error).__name__, str(error))
    else:
        caught = ("none", "no error raised")
    dist.barrier()  # every rank got here: nobody is stuck in a collective
    return caught


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_raises_on_every_rank_without_hanging(world4, case: str) -> None:
    message, error_type = BAD_INPUTS[case]
    results = world4.run(check_bad_input, case, timeout=60)
    assert len(set(results)) == 1, f"ranks disagree: {results}"
    name, text = results[0]
    assert name == error_type.__name__, text
    assert message in text, text


def test_no_process_group_is_a_clear_error() -> None:
    assert not dist.is_initialized()
    with pytest.raises(ConfigError, match="No default process group is initialized"):
        DMPCollection(build_model(MIXED_TABLES), 1, device="cpu")


def test_cuda_requested_without_cuda_is_a_clear_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ConfigError, match="CUDA is not available"):
        DMPCollection(build_model(MIXED_TABLES), 1, device="cuda")


def test_node_group_size_zero_means_not_set_as_in_torchrec(monkeypatch) -> None:
    from sparse2d.validation import resolve_node_group_size

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert resolve_node_group_size(0, 4, 2, "intra_host") == resolve_node_group_size(
        None, 4, 2, "intra_host"
    )
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert resolve_node_group_size(0, 4, 2, "intra_host") == 2  # 4 local ranks / 2 groups
    with pytest.raises(ConfigError, match="node_group_size=-1 must divide"):
        resolve_node_group_size(-1, 4, 2, "intra_host")
