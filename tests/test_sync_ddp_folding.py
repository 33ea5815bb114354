"""The sync policy's side of folding (``sparse2d.sync.ddp.folding``) on a real 2x2 gloo mesh:
which settings may ride DDP's all-reduce, and what a fold names and lands."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from sparse2d.sync.ddp import fold
from sparse2d.sync.shards import live_tensors
from tests.models import adagrad_2d

SETTINGS = {
    "auto": {"engine": "auto"},
    "sparse": {"engine": "sparse"},
    "delayed": {"engine": "dense", "delayed_optimizer_state": True},
}
"""One model per clause of ``may_fold`` (the dense engine is ``check_refused_land``'s)."""
MAY_FOLD = {"auto": True, "sparse": False, "delayed": False}


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
            policy.folding.forget()  # begun by hand, never landed: not a sync to land
    return out


def check_refused_land() -> str:
    """A fold whose mean never came back (some rank could not fold) is refused, not landed;
    and the same model with a user all-reduce hook may not fold at all."""
    with adagrad_2d(engine="dense", check_finite=False) as model:
        policy = model.sync_policy
        if not policy.may_fold:
            return "the dense engine may not fold"
        folded = policy.fold_begin(step=0)
        before = [t.clone() for t in live_tensors(policy.shards, True, True)]
        try:
            policy.step(0)
        except RuntimeError as error:
            after = live_tensors(policy.shards, True, True)
            unchanged = all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
            policy.hook = lambda tensors, pg: dist.all_reduce(tensors[0], group=pg)
            hooked = policy.may_fold
            return f"{error} | unchanged={unchanged} | mean={folded.mean} | hooked={hooked}"
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


def test_a_fold_without_its_mean_is_refused_and_writes_nothing(world4) -> None:
    for message in world4.run(check_refused_land):
        assert "could not fold its values into DDP's all-reduce" in message
        assert "unchanged=True" in message and "mean=None" in message
        assert "hooked=False" in message  # a user all-reduce hook never folds
