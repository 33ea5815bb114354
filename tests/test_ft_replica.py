"""``sparse2d.ft.FaultTolerance`` with no failure: exactly TorchRec 1D DMP, replicas identical.

Two torchft replica groups of two gloo ranks (each group its own process group, the way each
group is its own torchrun world), an in-process lighthouse, EXACT_SGD, sync every step.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.testing import assert_close

from sparse2d.ft.lighthouse import start_lighthouse
from tests.ft_groups import run_groups
from tests.models import (
    MIXED_TABLES,
    build_model,
    constraints_for,
    dense_params,
    full_weights,
    gather_tables,
    load_full_weights,
    make_batch,
    shard_1d,
    train,
)

GROUPS, SIZE, STEPS, LR = 2, 2, 4, 2.0


def _ft_train(group: int, lighthouse: str, steps: int) -> dict:
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from sparse2d import DMPCollection
    from sparse2d.ft import FaultTolerance, FTOptions

    tables = MIXED_TABLES
    weights = full_weights(build_model(tables, lr=LR))
    model = DMPCollection(
        build_model(tables, lr=LR), SIZE, device="cpu", constraints=constraints_for(tables),
        node_group_size=2,
    )  # fmt: skip
    load_full_weights(model, weights)
    opt = torch.optim.SGD(
        [p for _, p in in_backward_optimizer_filter(model.named_parameters())], lr=LR
    )
    ft = FaultTolerance(
        model, opt, FTOptions(replica_id=group, num_groups=GROUPS, min_replica_size=GROUPS,
                              lighthouse=lighthouse, timeout_s=20, quorum_timeout_s=60),
    )  # fmt: skip
    losses, participants = [], []
    while ft.step < steps:
        ft.start_step()
        rank_1d = group * SIZE + dist.get_rank()  # this group's slice of the global batch
        kjt, dense, target = make_batch(tables, ft.position, rank_1d)
        loss = ((model(kjt, dense) - target) ** 2).mean()
        loss.backward()
        participants.append(ft.participants)
        if ft.finish_step():
            losses.append(float(loss))
    summary = ft.summary()
    ft.shutdown()
    return {
        "tables": gather_tables(model, tables, None),
        "dense": dense_params(model),
        "losses": losses,
        "participants": participants,
        "summary": summary,
    }


def _reference(steps: int) -> dict:
    tables = MIXED_TABLES
    weights = full_weights(build_model(tables, lr=LR))
    model = shard_1d(build_model(tables, lr=LR), tables)
    load_full_weights(model, weights)
    losses = train(model, tables, steps, lr=LR)
    return {"tables": gather_tables(model, tables, None), "dense": dense_params(model),
            "losses": losses}  # fmt: skip


def test_no_failure_equals_torchrec_1d_and_replicas_identical(world4) -> None:
    lighthouse = start_lighthouse(min_replicas=GROUPS)
    try:
        out = run_groups(GROUPS, SIZE, _ft_train, lighthouse.address(), STEPS)
    finally:
        lighthouse.shutdown()
    ref = world4.run(_reference, STEPS)[0]
    for (g, r), got in out.items():
        assert got["summary"]["committed_steps"] == STEPS, got["summary"]
        assert got["summary"]["failed_commits"] == 0 and got["participants"] == [GROUPS] * STEPS
        for name, table in ref["tables"].items():
            assert_close(got["tables"][name], table, atol=1e-5, rtol=1e-5, msg=f"{g}/{r} {name}")
        for name, p in ref["dense"].items():
            assert_close(got["dense"][name], p, atol=1e-5, rtol=1e-5, msg=f"{g}/{r} {name}")
    base = out[(0, 0)]
    for key, got in out.items():  # replicas (and ranks of a group) bit-identical
        for name in base["tables"]:
            assert torch.equal(got["tables"][name], base["tables"][name]), (key, name)
        for name in base["dense"]:
            assert torch.equal(got["dense"][name], base["dense"][name]), (key, name)
