"""Replica repair: a rank that lost its shards is refilled from a healthy replica."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torchrec.optim import RowWiseAdagrad

from sparse2d import ConfigError, DMPCollection
from sparse2d.core.replica_repair import plan_repair, repair_from_replicas
from tests.models import MIXED_TABLES, build_model, constraints_for, train


def _trained_model(group: int) -> DMPCollection:
    module = build_model(MIXED_TABLES, optimizer=RowWiseAdagrad, lr=0.1)
    model = DMPCollection(module, group, device="cpu", constraints=constraints_for(MIXED_TABLES))
    train(model, MIXED_TABLES, 2, after_step=lambda _: model.sync())
    return model


def _local_state(model: DMPCollection) -> list[torch.Tensor]:
    tensors = [s.weight.detach().clone() for s in model.shard_states]
    tensors += [t.detach().clone() for s in model.shard_states for t in s.optimizer_states]
    tensors += [t.clone() for t in model.state_dict().values() if type(t) is torch.Tensor]
    return tensors


def _replica_copies(model: DMPCollection) -> list[list[torch.Tensor]]:
    """Every replica's copy of this rank's shards (same order on every replica)."""
    mine = _local_state(model)
    copies = [[torch.empty_like(t) for t in mine] for _ in range(model.num_replicas)]
    for i, tensor in enumerate(mine):
        dist.all_gather([c[i] for c in copies], tensor, group=model.replica_pg)
    return copies


def check_repair(broken: list[int]) -> bool:
    model = _trained_model(2)
    healthy = _local_state(model)
    rank = dist.get_rank()
    if rank in broken:  # simulate a restart: fresh weights, empty optimizer state, new dense
        with torch.no_grad():
            gen = torch.Generator().manual_seed(99 + rank)
            for s in model.shard_states:
                s.weight.copy_(torch.randn(s.weight.shape, generator=gen))
                for t in s.optimizer_states:
                    t.zero_()
            for t in model.state_dict().values():
                if type(t) is torch.Tensor:
                    t.copy_(torch.randn(t.shape, generator=gen))
    copies = _replica_copies(model)
    differs = any(not torch.equal(a, b) for a, b in zip(copies[0], copies[1], strict=True))
    if differs != bool(set(broken) & set(model.replica_group)):
        raise AssertionError("corruption did not make the replicas differ")
    repair_from_replicas(model, broken)
    for copy in _replica_copies(model):
        for got, want in zip(copy, healthy, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    return differs


def check_repair_rejects(group: int, broken: list[int]) -> str:
    module = build_model(MIXED_TABLES, optimizer=RowWiseAdagrad, lr=0.1)
    model = DMPCollection(module, group, device="cpu", constraints=constraints_for(MIXED_TABLES))
    try:
        repair_from_replicas(model, broken)
    except ConfigError as error:
        return str(error)
    return ""


@pytest.mark.parametrize("broken", [[1], [1, 2]])
def test_repair_restores_replicas(world4, broken: list[int]) -> None:
    # replica groups at (4, L=2): [0, 1] and [2, 3]; [1, 2] repairs from 0 and from 3
    differs = world4.run(check_repair, broken)
    assert differs == [True, True, 2 in broken, 2 in broken]


@pytest.mark.parametrize(("group", "broken"), [(2, [0, 1]), (4, [3]), (2, [7])])
def test_repair_rejects_unrepairable(world4, group: int, broken: list[int]) -> None:
    messages = world4.run(check_repair_rejects, group, broken)
    assert all(messages), messages
    assert all(("no healthy member" in m) or ("not ranks" in m) for m in messages), messages


def test_plan_repair_is_pure() -> None:
    assert plan_repair(8, 4, "intra_host", [1, 2]) == {0: 0, 1: 3}
    assert plan_repair(8, 4, "intra_host", []) == {}
    with pytest.raises(ConfigError, match="no healthy member"):
        plan_repair(4, 2, "intra_host", [2, 3])
