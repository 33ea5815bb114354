"""``sparse2d.ft.FaultTolerance`` with no failure: exactly TorchRec 1D DMP, replicas identical.

Two torchft replica groups of two gloo ranks (each group its own process group, the way each
group is its own torchrun world), an in-process lighthouse, EXACT_SGD, sync every step.
"""

from __future__ import annotations

import pytest
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
        build_model(tables, lr=LR),
        SIZE,
        device="cpu",
        constraints=constraints_for(tables),
        node_group_size=2,
    )
    load_full_weights(model, weights)
    opt = torch.optim.SGD(
        [p for _, p in in_backward_optimizer_filter(model.named_parameters())], lr=LR
    )
    ft = FaultTolerance(
        model,
        opt,
        FTOptions(
            replica_id=group,
            num_groups=GROUPS,
            min_replica_size=GROUPS,
            lighthouse=lighthouse,
            timeout_s=20,
            quorum_timeout_s=60,
        ),
    )
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
        "copies_sent_in_place": ft.channel.arena.placed,
    }


def _reference(steps: int) -> dict:
    tables = MIXED_TABLES
    weights = full_weights(build_model(tables, lr=LR))
    model = shard_1d(build_model(tables, lr=LR), tables)
    load_full_weights(model, weights)
    losses = train(model, tables, steps, lr=LR)
    return {
        "tables": gather_tables(model, tables, None),
        "dense": dense_params(model),
        "losses": losses,
    }


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
        # the first step sizes the send buffer; from then on the copies are gathered into it
        assert got["copies_sent_in_place"] == STEPS - 1, got["copies_sent_in_place"]
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


def _ft_fault(group: int, lighthouse: str, steps: int, fault: str) -> dict:
    """Train with ``fault`` in group 1: ``nan`` (rank 0 plants NaN in a shard after the
    backward of step 2) or ``plan`` (group 1 runs another config fingerprint)."""
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from sparse2d import DMPCollection
    from sparse2d.ft import FaultTolerance, FTOptions

    tables = MIXED_TABLES
    model = DMPCollection(
        build_model(tables, lr=0.1),
        dist.get_world_size(),
        device="cpu",
        constraints=constraints_for(tables),
        node_group_size=1,
    )
    opt = torch.optim.SGD(
        [p for _, p in in_backward_optimizer_filter(model.named_parameters())], lr=0.1
    )
    # the trainer's form: {dotted key: value}; group 1 runs another pipeline and MC kind
    keys = {"train.pipeline": '"none"', "model.managed_collision.kind": '"mch"', "data.seed": "0"}
    if fault == "plan" and group == 1:
        keys |= {"train.pipeline": '"sparse_dist"', "model.managed_collision.kind": '"zch"'}
    digest = keys
    options = FTOptions(
        replica_id=group, num_groups=2, lighthouse=lighthouse, timeout_s=10, quorum_timeout_s=30
    )
    ft = FaultTolerance(model, opt, options, config_digest=digest)
    try:
        while ft.step < steps:
            ft.start_step()
            kjt, dense, target = make_batch(tables, ft.position, group)
            ((model(kjt, dense) - target) ** 2).mean().backward()
            if fault == "nan" and group == 1 and ft.position == 2 and dist.get_rank() == 0:
                model.shard_states[0].weight[0, 0] = float("nan")
            ft.finish_step()
    except Exception as error:  # the group that must stop reports why
        return {"error": f"{type(error).__name__}: {error}"}
    finite = all(
        bool(torch.isfinite(t).all())
        for s in model.shard_states
        for t in [s.weight, *s.optimizer_states]
    )
    summary = ft.summary()
    ft.shutdown()
    return {"summary": summary, "finite": finite}


def test_non_finite_group_never_poisons_another() -> None:
    """Group 1's rank 0 plants a NaN in its shard: in that step every group drops the average
    (failed commit), every rank of group 1 stops with SyncError (the group's vote tells its
    other rank, whose own values are finite: the group restarts as one), group 0 trains on,
    finite."""
    lighthouse = start_lighthouse(min_replicas=1)
    try:
        out = run_groups(2, 2, _ft_fault, lighthouse.address(), 8, "nan")
    finally:
        lighthouse.shutdown()
    for rank in (0, 1):
        error = out[(1, rank)]["error"]
        assert f"SyncError: group 1 rank {rank}: non-finite" in error, out[(1, rank)]
        g0 = out[(0, rank)]
        assert g0["finite"] and g0["summary"]["final_step"] == 8, g0
        assert g0["summary"]["failed_commits"] >= 1 and g0["summary"]["min_groups_in_step"] == 1


def test_group_with_another_config_is_refused_when_it_joins() -> None:
    lighthouse = start_lighthouse(min_replicas=1)
    try:
        out = run_groups(2, 1, _ft_fault, lighthouse.address(), 4, "plan")
    finally:
        lighthouse.shutdown()
    errors = {g: r["error"] for (g, _), r in out.items() if "error" in r}
    assert len(errors) == 1, out  # the group that healed refuses; the other trains on
    ((group, text),) = errors.items()
    assert f"ConfigError: group {group} cannot join: group {1 - group} runs another" in text, text
    assert "model.managed_collision.kind=" in text and "train.pipeline=" in text, text
    assert "data.seed" not in text and len(text.splitlines()) == 1, text  # one line, the keys
    assert out[(1 - group, 0)]["summary"]["final_step"] == 4


def _refusal() -> str:
    """The error ``FaultTolerance`` raises for a model it cannot run (before connecting)."""
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from sparse2d import ConfigError, DMPCollection
    from sparse2d.ft import FaultTolerance, FTOptions

    # L=1 on 2 ranks: 2 replicas inside one world
    model = DMPCollection(
        build_model(MIXED_TABLES), 1, device="cpu", constraints=constraints_for(MIXED_TABLES)
    )
    opt = torch.optim.SGD([p for _, p in in_backward_optimizer_filter(model.named_parameters())])
    try:
        FaultTolerance(model, opt, FTOptions(replica_id=0, num_groups=2, lighthouse="http://x:1"))
    except ConfigError as error:
        return str(error)
    finally:
        model.close()
    return "not refused"


def test_replicas_inside_one_world_are_refused_before_connecting(world2) -> None:
    for text in world2.run(_refusal):
        assert "needs one sharding group per torchrun world" in text and "got 2 replicas" in text


def _shard_values(model, shards) -> list[torch.Tensor]:
    from sparse2d.sync.shards import flush_caches, live_tensors

    flush_caches(shards)
    return [t.clone() for t in live_tensors(shards, weights=True, states=True)]


def _ft_momentum(group: int, lighthouse: str, steps: int, every: int) -> dict:
    """Row-wise AdaGrad with momentum scaling (c = the groups in the quorum), synced every
    ``every`` steps."""
    from sparse2d.ft import FaultTolerance, FTOptimizer, FTOptions
    from tests.models import adagrad_2d

    model = adagrad_2d(group_size=SIZE, momentum_scaling=True, every=every)
    opt = torch.optim.SGD([p for _, p in _dense(model)], lr=0.1)
    options = FTOptions(
        replica_id=group,
        num_groups=GROUPS,
        min_replica_size=GROUPS,
        lighthouse=lighthouse,
        timeout_s=20,
        quorum_timeout_s=60,
    )
    ft = FaultTolerance(model, opt, options)
    wrapper = FTOptimizer(ft)
    while ft.step < steps:
        wrapper.zero_grad()
        kjt, dense, target = make_batch(MIXED_TABLES, ft.position, dist.get_rank() * GROUPS + group)
        ((model(kjt, dense) - target) ** 2).mean().backward()
        wrapper.step()
    out = {"values": _shard_values(model, ft.shards), "factor": ft.policy.scaler.factor}
    ft.shutdown()
    return out


def _dense(model):
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    return in_backward_optimizer_filter(model.named_parameters())


def _in_world_momentum(steps: int, every: int) -> dict:
    from tests.models import adagrad_2d

    model = adagrad_2d(group_size=SIZE, momentum_scaling=True, every=every)
    opt = torch.optim.SGD([p for _, p in _dense(model)], lr=0.1)
    for step in range(steps):
        kjt, dense, target = make_batch(MIXED_TABLES, step, dist.get_rank())
        ((model(kjt, dense) - target) ** 2).mean().backward()
        opt.step()
        opt.zero_grad()
        model.maybe_sync(step)
    model.sync_policy.finish()
    return {"values": _shard_values(model, model.shard_states)}


@pytest.mark.parametrize("every", [1, 2])
def test_momentum_scaling_under_ft_equals_in_world_2d(world4, every: int) -> None:
    """The accumulators' averaged growth divided by c = 2 groups, as in-world 2D with G=2;
    at a sync every step and every 2 steps (local SGD: the same cadence and phase)."""
    assert STEPS % every == 0  # both end on a sync
    lighthouse = start_lighthouse(min_replicas=GROUPS)
    try:
        out = run_groups(GROUPS, SIZE, _ft_momentum, lighthouse.address(), STEPS, every)
    finally:
        lighthouse.shutdown()
    ref = world4.run(_in_world_momentum, STEPS, every)
    for (g, r), got in out.items():
        assert got["factor"] == GROUPS
        expected = ref[r * GROUPS + g]["values"]
        for a, b in zip(got["values"], expected, strict=True):
            assert_close(a, b, atol=1e-5, rtol=1e-5, msg=f"group {g} rank {r}")
