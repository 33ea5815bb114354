"""Replica syncs folded into DDP's gradient all-reduce (``sparse2d.sync.ddp.fold``) on a real
2x2 gloo mesh (world 4, L=2): equal to TorchRec's 1D DMP and to the unfolded sync,
replicas bit-identical, and a NaN refused with nothing written."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
import torch.distributed as dist
from torchrec.optim.optimizers import in_backward_optimizer_filter

from sparse2d import DMPCollection, SyncError
from sparse2d.sync.ddp import fold
from tests.models import (
    MIXED_TABLES,
    adagrad_2d,
    make_batch,
    replica_max_diff,
    train,
)
from tests.test_core_collection import ALL_TYPES, check_2d_equals_1d

STEPS = 6
FOLDED = STEPS - 2
"""Step 0's backward is not armed and step 1's is the DDP hook's first: both sync on their
own; every later step's sync folds."""


@contextmanager
def fold_limit(max_bytes: int) -> Iterator[None]:
    """``FOLD_MAX_BYTES`` for carriers planned inside, at a model's first ``maybe_sync``
    (restored after: the worker processes are shared between tests)."""
    saved, fold.FOLD_MAX_BYTES = fold.FOLD_MAX_BYTES, max_bytes
    try:
        yield
    finally:
        fold.FOLD_MAX_BYTES = saved


@pytest.mark.parametrize(
    ("engine", "layout", "tables"),
    [
        ("dense", "intra_host", "mixed"),
        ("auto", "inter_host", "mixed"),
        ("dense", "intra_host", "all_types"),  # TW, CW, TWCW, RW, TWRW, grid: uneven slots
    ],
)
def test_folded_sync_equals_1d(world4, engine: str, layout: str, tables: str) -> None:
    chosen = ALL_TYPES if tables == "all_types" else MIXED_TABLES
    results = world4.run(
        check_2d_equals_1d, 2, "pooled", layout, chosen, STEPS, engine=engine, every=1
    )
    for result in results:
        assert result["folds"] == FOLDED
        assert result["votes_carried"] == FOLDED  # the NaN/inf vote rode the same all-reduce
        assert result["moved"] > 1e-3
        assert result["replica_diffs"] == [0.0] * STEPS


def _trained(limit: int, options: dict) -> tuple[DMPCollection, list]:
    with fold_limit(limit):
        model = adagrad_2d(**options)
        reports: list = []
        train(model, MIXED_TABLES, STEPS, after_step=lambda s: reports.append(model.maybe_sync(s)))
    model.sync_policy.finish()
    return model, reports


def check_fold_matches_unfolded(options: dict) -> dict:
    """Row-wise AdaGrad (weights and accumulators), folded vs the same syncs unfolded."""
    folded, folded_reports = _trained(fold.FOLD_MAX_BYTES, options)
    plain, plain_reports = _trained(0, options)
    for a, b in zip(folded.shard_states, plain.shard_states, strict=True):
        for x, y in zip([a.weight, *a.optimizer_states], [b.weight, *b.optimizer_states]):
            torch.testing.assert_close(x, y)
    divergences = [
        (r.divergence, p.divergence)
        for r, p in zip(folded_reports, plain_reports, strict=True)
        if r is not None
    ]
    return {
        "folds": folded.sync_policy.folds,
        "plain_folds": plain.sync_policy.folds,
        "synced": [r is not None for r in folded_reports],
        "plain_synced": [r is not None for r in plain_reports],
        "divergences": divergences,
        "replica_diff": replica_max_diff(folded, folded.replica_pg),
    }


@pytest.mark.parametrize(
    ("options", "folds"),
    [
        ({"engine": "dense"}, FOLDED),
        ({"engine": "auto", "hide": True, "divergence_every": 2}, FOLDED),
        ({"engine": "dense", "every": 2, "momentum_scaling": True}, 2),  # after steps 3, 5
        ({"engine": "dense", "check_finite": False}, FOLDED),  # no vote: folds all the same
        ({"engine": "dense", "include_optimizer_state": False}, FOLDED),
        ({"engine": "sparse"}, 0),  # touched rows are agreed by the sync itself
        ({"engine": "dense", "delayed_optimizer_state": True}, 0),
    ],
)
def test_fold_matches_unfolded(world4, options: dict, folds: int) -> None:
    for result in world4.run(check_fold_matches_unfolded, options):
        assert result["folds"] == folds
        assert result["plain_folds"] == 0
        assert result["synced"] == result["plain_synced"]
        for got, expected in result["divergences"]:
            assert (got is None) == (expected is None)
            if got is not None:
                assert got == pytest.approx(expected, rel=1e-5, abs=1e-9)
        if options.get("include_optimizer_state", True):  # else replicas' state differs
            assert result["replica_diff"] == 0.0


def check_unfolded_sync_after_folds(limit: int) -> dict:
    """Folds pause touched-row tracking (``auto``); steps without a sync, then
    ``model.sync()``: every row updated meanwhile must still be averaged."""
    with fold_limit(limit):
        model = adagrad_2d(engine="auto")
        train(model, MIXED_TABLES, STEPS, after_step=model.maybe_sync)
        # two steps, no maybe_sync: the first one's backward was armed (its sync folds), the
        # second one's updates are made with tracking paused
        train(model, MIXED_TABLES, 2, seed=1)
        model.sync()
    return {
        "folds": model.sync_policy.folds,
        "state": [t.clone() for s in model.shard_states for t in [s.weight, *s.optimizer_states]],
        "replica_diff": replica_max_diff(model, model.replica_pg),
    }


def check_sync_after_folds_matches() -> dict:
    folded = check_unfolded_sync_after_folds(fold.FOLD_MAX_BYTES)
    plain = check_unfolded_sync_after_folds(0)
    for a, b in zip(folded["state"], plain["state"], strict=True):
        torch.testing.assert_close(a, b)
    return {k: (folded[k], plain[k]) for k in ("folds", "replica_diff")}


def test_sync_after_folds_covers_rows_updated_meanwhile(world4) -> None:
    for result in world4.run(check_sync_after_folds_matches):
        assert result == {"folds": (FOLDED + 1, 0), "replica_diff": (0.0, 0.0)}


def _per_module_run(limit: int) -> tuple[dict[str, torch.Tensor], DMPCollection]:
    """Per-module group sizes (EBC L=2: 2 replicas, EC L=1: 4 replicas): two policies, each
    with its own region in the fold; trained with the cadence sync."""
    from tests.test_core_contexts import ALL, per_module, tables_and_coverage

    with fold_limit(limit):
        model = per_module(ebc_group=2, ec_group=1)
        dense = torch.optim.SGD(
            [p for _, p in in_backward_optimizer_filter(model.named_parameters())], lr=0.1
        )
        for step in range(STEPS):
            kjt, x, target = make_batch(ALL, step, dist.get_rank())
            ((model(kjt, x) - target) ** 2).mean().backward()
            dense.step()
            dense.zero_grad()
            model.maybe_sync(step)
    return tables_and_coverage(model)[0], model


def check_per_module_folds() -> dict:
    folded_tables, folded = _per_module_run(fold.FOLD_MAX_BYTES)
    plain_tables, plain = _per_module_run(0)
    for name in plain_tables:
        torch.testing.assert_close(folded_tables[name], plain_tables[name])
    return {
        "folds": [p.folds for p in folded.sync_policy.policies],
        "plain_folds": plain.sync_policy.folds,
        "replica_diff": max(  # each context's shards over its own replica group
            replica_max_diff(folded, p.replica_pg, p.shards) for p in folded.sync_policy.policies
        ),
    }


def test_per_module_policies_fold_side_by_side(world4) -> None:
    for result in world4.run(check_per_module_folds):
        assert result == {"folds": [FOLDED, FOLDED], "plain_folds": 0, "replica_diff": 0.0}


def check_nan_in_fold() -> dict:
    """Rank 1's weight turns NaN inside a backward whose sync folds: every rank raises at
    its next maybe_sync and no replica took the NaN (healthy ranks stay finite)."""
    model = adagrad_2d(engine="dense")
    train(model, MIXED_TABLES, 3, after_step=model.maybe_sync)
    shard = next(s for s in model.shard_states if s.rows > 1)

    def poison(grad: torch.Tensor) -> None:
        with torch.no_grad():
            shard.weight[1] = float("nan")

    hook = (lambda loss: loss.register_hook(poison)) if dist.get_rank() == 1 else None
    train(model, MIXED_TABLES, 1, on_loss=hook)
    try:
        model.maybe_sync(3)
        message = None
    except SyncError as error:
        message = str(error)
    finite = all(bool(torch.isfinite(s.weight).all()) for s in model.shard_states)
    return {"message": message, "finite": finite, "folds": model.sync_policy.folds}


def test_nan_in_a_folded_sync_is_refused(world4) -> None:
    results = world4.run(check_nan_in_fold)
    assert [r["finite"] for r in results] == [True, False, True, True]
    for result in results:
        assert result["message"] and "global rank(s) [1]" in result["message"]
        assert result["folds"] == 1  # step 2 folded; step 3's fold was refused


def check_plan() -> dict:
    """The layout of a real model's policy: one slot per replica group, in rank order."""
    model = adagrad_2d(engine="dense")
    policy = model.sync_policy
    slot = fold.plan_folds([policy], dist.group.WORLD)[0]
    numel = policy.fold_numel(fold.FOLD_DTYPE)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, torch.tensor([numel]))
    region = 4 * slot.total if slot is not None else 0
    return {
        "slot": None if slot is None else (slot.offset, slot.numel, slot.total, slot.replicas),
        "sizes": [int(s) for s in sizes],
        "fits": fold.plan_folds([policy], dist.group.WORLD, max_bytes=region)[0] is not None,
        "too_small": fold.plan_folds([policy], dist.group.WORLD, max_bytes=region - 1)[0],
        "other_dtype": policy.fold_numel(torch.float16),
    }


def test_plan_gives_each_replica_group_a_slot(world4) -> None:
    results = world4.run(check_plan)
    sizes = results[0]["sizes"]  # intra_host: replica groups are ranks {0, 1} and {2, 3}
    assert sizes[0] == sizes[1] and sizes[2] == sizes[3]
    total = sizes[0] + sizes[2]
    expected = [(0, sizes[0]), (0, sizes[1]), (sizes[0], sizes[2]), (sizes[0], sizes[3])]
    for result, (offset, numel) in zip(results, expected, strict=True):
        assert result["slot"] == (offset, numel, total, 2)
        assert result["fits"]
        assert result["too_small"] is None  # one byte short of the region: not folded
        assert result["other_dtype"] == -1
