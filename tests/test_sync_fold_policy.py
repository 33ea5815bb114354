"""The sync policy's side of folding (``sparse2d.sync.fold_policy``) on a real 2x2 gloo mesh:
which settings may ride DDP's all-reduce, and what a fold names and lands."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from sparse2d.sync import fold
from sparse2d.sync.tensors import live_tensors
from tests.models import adagrad_2d

SETTINGS = {
    "dense": {"engine": "dense"},
    "auto": {"engine": "auto"},
    "sparse": {"engine": "sparse"},
    "bf16": {"engine": "dense", "compression": "bf16"},
    "overlap": {"engine": "dense", "overlap": True},
    "delayed": {"engine": "dense", "delayed_optimizer_state": True},
}
MAY_FOLD = {"dense": True, "auto": True, "sparse": False, "bf16": False, "overlap": False,
            "delayed": False}  # fmt: skip


def check_may_fold() -> dict:
    """Per setting: may it fold, does ``fold_begin`` take it, and what a fold names."""
    out: dict = {}
    for name, options in SETTINGS.items():
        with adagrad_2d(**options, every=2) as model:
            policy = model.sync_policy
            folded = policy.fold_begin(step=1)
            live = live_tensors(policy.shards, True, True)
            out[name] = {
                "may_fold": policy.may_fold,
                "began": folded is not None,
                "names_live": folded is not None
                and [t.data_ptr() for t in folded.tensors] == [t.data_ptr() for t in live],
                "due": [policy.fold_due(s) for s in range(4)],
                "numel": policy.fold_numel(fold.FOLD_DTYPE) == sum(t.numel() for t in live),
            }
            policy._folded = None  # begun by hand, never landed: not a sync to land
    hooked = adagrad_2d(engine="dense")
    hooked.sync_policy.hook = lambda tensors, pg: dist.all_reduce(tensors[0], group=pg)
    out["user_hook"] = {"may_fold": hooked.sync_policy.may_fold}
    hooked.close()
    return out


def check_refused_land() -> str:
    """A fold whose mean never came back (some rank could not fold) is refused, not landed."""
    with adagrad_2d(engine="dense", check_finite=False) as model:
        policy = model.sync_policy
        folded = policy.fold_begin(step=0)
        before = [t.clone() for t in live_tensors(policy.shards, True, True)]
        try:
            policy.step(0)
        except RuntimeError as error:
            after = live_tensors(policy.shards, True, True)
            unchanged = all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
            return f"{error} | unchanged={unchanged} | mean={folded.mean}"
    return "landed"


@pytest.fixture(scope="module")
def results(world4) -> list[dict]:
    return world4.run(check_may_fold)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_plain_averages_may_fold_and_the_rest_may_not(results, name: str) -> None:
    for result in results:
        got = result[name]
        assert got["may_fold"] is MAY_FOLD[name]
        assert got["began"] is MAY_FOLD[name]  # fold_begin declines what may not fold
        assert got["names_live"] is MAY_FOLD[name]  # a fold averages the live values
        assert got["due"] == [False, True, False, True]  # every=2: steps 1 and 3
        assert got["numel"]


def test_a_user_all_reduce_hook_never_folds(results) -> None:
    assert all(r["user_hook"]["may_fold"] is False for r in results)


def test_a_fold_without_its_mean_is_refused_and_writes_nothing(world4) -> None:
    for message in world4.run(check_refused_land):
        assert "could not fold its values into DDP's all-reduce" in message
        assert "unchanged=True" in message and "mean=None" in message
