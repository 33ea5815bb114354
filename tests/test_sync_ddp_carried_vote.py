"""The NaN/inf vote carried by DDP's gradient all-reduce, and the sync run at the end of the
backward (``sparse2d.sync.ddp.carried_vote``), on a real 2x2 gloo mesh (world 4, L=2)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torchrec.optim.optimizers import in_backward_optimizer_filter

from sparse2d import DMPCollection, SyncError, patches
from sparse2d.patches import torch_ddp_comm_hook
from sparse2d.sync.ddp import fold
from tests.models import (
    MIXED_TABLES,
    adagrad_2d,
    dense_params,
    make_batch,
    replica_max_diff,
    train,
)
from tests.test_sync_ddp_fold import fold_limit

STEPS = 6


def _state(model: DMPCollection) -> list[torch.Tensor]:
    shards = [
        t.detach().clone() for s in model.shard_states for t in [s.weight, *s.optimizer_states]
    ]
    return shards + [p.detach().clone() for p in dense_params(model).values()]


def check_carried_matches_own_vote(options: dict) -> dict:
    """Train with maybe_sync every step: guard on (votes ride DDP where they can) vs guard
    off and no folding (no carrier: each sync runs after the dense step). Same values,
    replicas identical."""
    carried = adagrad_2d(**options)
    train(carried, MIXED_TABLES, STEPS, after_step=carried.maybe_sync)
    with fold_limit(0):
        plain = adagrad_2d(**{**options, "check_finite": False})
        train(plain, MIXED_TABLES, STEPS, after_step=plain.maybe_sync)
    carried.sync_policy.finish()
    plain.sync_policy.finish()
    for a, b in zip(_state(carried), _state(plain), strict=True):
        torch.testing.assert_close(a, b)
    return {
        "votes": carried.sync_policy.votes_carried,
        "plain_votes": plain.sync_policy.votes_carried,
        "carrier": carried._replicas.early.carrier is not None,
        "plain_carrier": plain._replicas.early.carrier is not None,
        "replica_diff": replica_max_diff(carried, carried.replica_pg),
    }


@pytest.mark.parametrize(
    ("options", "votes"),
    [
        # step 0 is not armed; step 1 is the hook's first backward (never carried)
        ({"engine": "dense"}, STEPS - 2),
        ({"engine": "dense", "hide": True}, STEPS - 2),
        ({"engine": "dense", "every": 2}, 2),  # syncs after steps 1, 3, 5: 3 and 5 carried
        # no carrier (DDP left as is): only the sync knows its touched rows / delayed state
        ({"engine": "sparse"}, 0),
        ({"engine": "dense", "delayed_optimizer_state": True}, 0),
    ],
)
def test_vote_rides_ddp_where_it_can(world4, options: dict, votes: int) -> None:
    for result in world4.run(check_carried_matches_own_vote, options):
        assert result["votes"] == votes
        assert result["carrier"] == (votes > 0)
        assert result["plain_votes"] == 0
        assert not result["plain_carrier"]
        assert result["replica_diff"] == 0.0


def check_poison_after_backward(hide: bool, folded: bool) -> dict:
    """A NaN written after the backward is written after its sync: it never spreads; a
    hidden sync's landing overwrites it, otherwise the next sync refuses it."""
    with fold_limit(fold.FOLD_MAX_BYTES if folded else 0):  # planned at the first arm
        model = adagrad_2d(engine="dense", hide=hide)
        train(model, MIXED_TABLES, 4, after_step=model.maybe_sync)
    train(model, MIXED_TABLES, 1)  # armed: its sync runs at the end of its backward
    shard = next(s for s in model.shard_states if s.rows > 1)
    if dist.get_rank() == 1:
        with torch.no_grad():
            shard.weight[1] = float("nan")
    report = model.maybe_sync(4)  # the report of the sync already run; nothing new is sent
    model.sync_policy.finish()
    finite_after = all(bool(torch.isfinite(s.weight).all()) for s in model.shard_states)
    try:
        model.sync()
        message = None
    except SyncError as error:
        message = str(error)
    return {
        "reported": report is not None,
        "finite": finite_after,
        "message": message,
        "folds": model.sync_policy.folds,
    }


@pytest.mark.parametrize(("hide", "folded"), [(False, False), (True, False), (True, True)])
def test_value_written_after_backward_never_spreads(world4, hide: bool, folded: bool) -> None:
    results = world4.run(check_poison_after_backward, hide, folded)
    assert all(r["reported"] for r in results)
    assert all(r["folds"] == (3 if folded else 0) for r in results)
    if hide and not folded:  # the landing wrote the replica average over the NaN
        assert all(r["finite"] and r["message"] is None for r in results)
        return
    # a folded sync landed inside the backward (hide has nothing to hide): refused next
    assert [r["finite"] for r in results] == [True, False, True, True]
    assert all(r["message"] and "global rank(s) [1]" in r["message"] for r in results)


def _two_backwards_per_step(model: DMPCollection, steps: range) -> None:
    """Each step: two losses, two DDP backwards (two fused updates), then maybe_sync."""
    dense_opt = torch.optim.SGD(
        [p for _, p in in_backward_optimizer_filter(model.named_parameters())], lr=0.1
    )
    for step in steps:
        for half in (0, 1):
            kjt, dense, target = make_batch(MIXED_TABLES, 2 * step + half, dist.get_rank())
            ((model(kjt, dense) - target) ** 2).mean().backward()
        dense_opt.step()
        dense_opt.zero_grad()
        model.maybe_sync(step)


def check_two_backwards_per_step() -> dict:
    """Never armed: every sync runs after the step's last backward, as with the guard off."""
    carried = adagrad_2d(engine="dense")
    _two_backwards_per_step(carried, range(STEPS))
    plain = adagrad_2d(engine="dense", check_finite=False)
    _two_backwards_per_step(plain, range(STEPS))
    for a, b in zip(_state(carried), _state(plain), strict=True):
        torch.testing.assert_close(a, b)
    return {
        "votes": carried.sync_policy.votes_carried,
        "replica_diff": replica_max_diff(carried, carried.replica_pg),
    }


def check_loop_changes_shape() -> dict:
    """One backward per step, then two: the first two-backward step synced mid-step early,
    so its maybe_sync syncs again (replicas identical after it) and early syncs stop."""
    model = adagrad_2d(engine="dense")
    train(model, MIXED_TABLES, 4, after_step=model.maybe_sync)
    votes = model.sync_policy.votes_carried
    _two_backwards_per_step(model, range(4, 4 + STEPS))
    model.sync_policy.finish()
    return {
        "early_votes": votes,
        "later_votes": model.sync_policy.votes_carried - votes,
        "enabled": model._replicas.early.enabled,
        "replica_diff": replica_max_diff(model, model.replica_pg),
    }


def test_several_ddp_backwards_per_step_sync_after_the_step(world4) -> None:
    for result in world4.run(check_two_backwards_per_step):
        assert result == {"votes": 0, "replica_diff": 0.0}
    for result in world4.run(check_loop_changes_shape):
        assert result == {"early_votes": 2, "later_votes": 1, "enabled": False, "replica_diff": 0.0}


def check_user_comm_hook() -> dict:
    """A user's DDP comm hook, registered after the carrier, runs instead; nothing is carried."""
    model = adagrad_2d(engine="dense")
    train(model, MIXED_TABLES, 1, after_step=model.maybe_sync)  # attaches the carrier
    calls = []

    def counting_hook(state, bucket):  # type: ignore[no-untyped-def]  (DDP checks real classes)
        calls.append(bucket.index())
        return allreduce_hook(state, bucket)

    routed = torch_ddp_comm_hook.routed(model._dmp_wrapped_module)
    model._dmp_wrapped_module.register_comm_hook(None, counting_hook)
    train(model, MIXED_TABLES, 4, after_step=model.maybe_sync)
    model.sync_policy.finish()
    return {
        "calls": len(calls),
        "votes": model.sync_policy.votes_carried,
        "replica_diff": replica_max_diff(model, model.replica_pg),
        "routed": routed,
    }


def test_user_comm_hook_runs_and_nothing_is_carried(world4) -> None:
    for result in world4.run(check_user_comm_hook):
        assert result["calls"] >= 4
        assert result["votes"] == 0
        assert result["replica_diff"] == 0.0
        assert result["routed"]  # the torch_ddp_comm_hook patch, on this DDP instance


def check_opted_out_comm_hook() -> dict:
    """``opt_out("torch_ddp_comm_hook")``: no carrier, DDP's own ``register_comm_hook``; a
    user's hook is DDP's, and each guarded sync votes by itself (same values, in sync)."""
    patches.opt_out("torch_ddp_comm_hook")
    try:
        model = adagrad_2d(engine="dense")
        train(model, MIXED_TABLES, 2, after_step=model.maybe_sync)
        ddp = model._dmp_wrapped_module
        carrier, routed = model._replicas.early.carrier, torch_ddp_comm_hook.routed(ddp)
        calls = []

        def counting_hook(state, bucket):  # type: ignore[no-untyped-def]
            calls.append(bucket.index())
            return allreduce_hook(state, bucket)

        ddp.register_comm_hook(None, counting_hook)
        train(model, MIXED_TABLES, 4, after_step=model.maybe_sync)
        model.sync_policy.finish()
        return {
            "carrier": carrier is not None,
            "routed": routed,
            "own_hook": bool(ddp._comm_hooks),
            "calls": len(calls) >= 4,
            "votes": model.sync_policy.votes_carried,
            "replica_diff": replica_max_diff(model, model.replica_pg),
        }
    finally:
        patches.opt_in("torch_ddp_comm_hook")


def test_opted_out_comm_hook_leaves_ddp_as_it_is(world4) -> None:
    for result in world4.run(check_opted_out_comm_hook):
        assert result == {
            "carrier": False,
            "routed": False,
            "own_hook": True,
            "calls": True,
            "votes": 0,
            "replica_diff": 0.0,
        }


def check_one_replica_has_no_carrier() -> bool:
    model = adagrad_2d(group_size=4, engine="dense")
    train(model, MIXED_TABLES, 3, after_step=model.maybe_sync)
    return model._replicas.early.carrier is None


def test_1d_keeps_ddp_as_is(world4) -> None:
    assert world4.run(check_one_replica_has_no_carrier) == [True] * 4


def check_carried_vote_adds_no_collective(hide: bool) -> dict:
    """``dist.all_reduce`` calls over ``STEPS`` steps (no folds): guard on vs off. On adds
    exactly its own votes (``Ballot.start``: the syncs DDP could not carry) and DDP's own
    bucket all-reduces, which the carrier's comm hook makes in Python instead of DDP in C++
    (one per bucket, the carried ones included); nothing else."""
    from sparse2d.sync.ballot import Ballot
    from sparse2d.sync.ddp.carried_vote import DdpVote

    counts = {"all_reduce": 0, "own_votes": 0, "buckets": 0}

    def counted(key: str, fn):  # type: ignore[no-untyped-def]
        def run(*args, **kwargs):  # type: ignore[no-untyped-def]
            counts[key] += 1
            return fn(*args, **kwargs)

        return run

    saved = dist.all_reduce, Ballot.start, DdpVote.bucket
    runs = {}
    with fold_limit(0):
        for guard in (True, False):
            model = adagrad_2d(engine="dense", hide=hide, check_finite=guard)
            counts.update(all_reduce=0, own_votes=0, buckets=0)
            dist.all_reduce = counted("all_reduce", saved[0])
            Ballot.start = counted("own_votes", saved[1])  # type: ignore[method-assign]
            DdpVote.bucket = counted("buckets", saved[2])  # type: ignore[method-assign]
            try:
                train(model, MIXED_TABLES, STEPS, after_step=model.maybe_sync)
                model.sync_policy.finish()
            finally:
                dist.all_reduce, Ballot.start, DdpVote.bucket = saved  # type: ignore[method-assign]
            runs[guard] = {**counts, "carried": model.sync_policy.votes_carried}
    return runs


@pytest.mark.parametrize("hide", [False, True])
def test_carried_vote_adds_no_collective(world4, hide: bool) -> None:
    for runs in world4.run(check_carried_vote_adds_no_collective, hide):
        on, off = runs[True], runs[False]
        assert on["carried"] == STEPS - 2 and off["carried"] == 0
        assert on["own_votes"] == 2 and off["own_votes"] == 0  # steps 0 and 1: not carried
        assert off["buckets"] == 0 and on["buckets"] >= STEPS - 1  # the hook from step 1 on
        assert on["all_reduce"] == off["all_reduce"] + on["own_votes"] + on["buckets"], runs
