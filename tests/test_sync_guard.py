"""The NaN/inf guard of sync on a real 2x2 gloo mesh (world 4, L=2): every rank raises
``SyncError`` naming the table and the rank, and no replica changes."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from sparse2d import DMPCollection, SyncError
from sparse2d.sync.guard import all_finite
from sparse2d.sync.policy import SyncOptions
from tests.models import MIXED_TABLES, adagrad_2d, train

BAD_RANK = {"weight": 1, "state": 2}
"""world 4, L=2 intra_host: replica groups [0,1] and [2,3]; rank 1's NaN must also stop 2 and 3."""


def _snapshot(model: DMPCollection) -> list[torch.Tensor]:
    return [t.detach().clone() for s in model.shard_states for t in [s.weight, *s.optimizer_states]]


def check_poisoned_sync(where: str, value: float, options: dict) -> dict:
    """Train a little with syncs, poison one row on one rank, sync: every rank must raise."""
    options = {"hide": False, **options}  # blocking unless the case hides (``hidden``)
    if options.pop("in_place", False):  # average the live views, whatever their size
        from sparse2d.sync.engines import base as engine

        saved, engine.IN_PLACE_MIN_BYTES = engine.IN_PLACE_MIN_BYTES, 0
        try:
            model = adagrad_2d(**options)
            assert model.sync_policy.engine.payload(True, True, in_place=True).in_place
            return _poisoned_sync(model, where, value, options)
        finally:
            engine.IN_PLACE_MIN_BYTES = saved
    return _poisoned_sync(adagrad_2d(**options), where, value, options)


def _poisoned_sync(model: DMPCollection, where: str, value: float, options: dict) -> dict:
    train(model, MIXED_TABLES, 3, after_step=model.maybe_sync)
    model.sync_policy.finish()  # land hidden/delayed transfers: the values before the bad sync
    rank, table, poison = dist.get_rank(), None, None
    if rank == BAD_RANK[where]:
        index, shard = next((i, s) for i, s in enumerate(model.shard_states) if s.rows > 1)
        table = shard.table

        def poison(grad: torch.Tensor) -> None:
            with torch.no_grad():
                (shard.weight if where == "weight" else shard.optimizer_states[0])[1] = value
            engine = model.sync_policy.engine
            if hasattr(engine, "tracker"):  # the sparse engines send only rows marked touched
                engine.tracker.mark_rows(index, torch.tensor([1]))

    # One more step, poisoned in its backward (after its lookups, before the fused update),
    # as a NaN from training arises; a sync carried by DDP runs at the end of this backward.
    train(model, MIXED_TABLES, 1, on_loss=lambda loss: poison and loss.register_hook(poison))
    before = _snapshot(model)
    try:
        model.maybe_sync(3 if options.get("every", 1) == 1 else options["every"] - 1)
        model.sync_policy.finish()
        message = None
    except SyncError as error:
        message = str(error)
    after = _snapshot(model)
    unchanged = all(
        torch.allclose(a, b, rtol=0, atol=0, equal_nan=True)
        for a, b in zip(before, after, strict=True)
    )
    return {"table": table, "message": message, "unchanged": unchanged}


def check_guard_off_spreads() -> bool:
    """Without the guard the NaN reaches the healthy replica (the guard is what stops it)."""
    model = adagrad_2d(check_finite=False, engine="dense")
    if dist.get_rank() == 1:
        with torch.no_grad():
            model.shard_states[0].weight[0, 0] = float("nan")
    model.sync()
    return bool(torch.isnan(model.shard_states[0].weight).any())


CASES = {
    "dense": {"engine": "dense"},
    "dense_in_place": {"engine": "dense", "in_place": True},  # the vote passes before sending
    "sparse": {"engine": "sparse"},
    "auto": {"engine": "auto"},
    "delayed_state": {"engine": "sparse", "delayed_optimizer_state": True},
    "every2_scaled": {"every": 2, "momentum_scaling": True},
    "hidden": {"engine": "auto", "hide": True},  # the vote is waited when the sync lands
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize(("where", "value"), [("weight", float("nan")), ("state", float("inf"))])
def test_non_finite_stops_every_rank(world4, case: str, where: str, value: float) -> None:
    results = world4.run(check_poisoned_sync, where, value, CASES[case])
    table = results[BAD_RANK[where]]["table"]
    kind = "weight" if where == "weight" else "optimizer state"
    for rank, result in enumerate(results):
        assert result["message"] is not None, f"rank {rank} did not raise SyncError"
        assert f"{table} ({kind})" in result["message"], result["message"]
        assert f"global rank(s) [{BAD_RANK[where]}]" in result["message"], result["message"]
        assert result["unchanged"], f"rank {rank}: values changed by a refused sync"


def test_guard_off_lets_nan_spread(world4) -> None:
    assert world4.run(check_guard_off_spreads) == [True, True, False, False]


@pytest.mark.parametrize(
    ("values", "finite"),
    [
        ([1.0, -2.0], True),
        ([3e38, 3e38], True),  # the fast sum overflows; the exact check must not report it
        ([1.0, float("nan")], False),
        ([float("inf"), float("-inf")], False),
        ([], True),
    ],
)
def test_all_finite(values: list[float], finite: bool) -> None:
    assert all_finite(torch.tensor(values, dtype=torch.float32)) is finite


def test_all_finite_low_precision_and_integers() -> None:
    assert not all_finite(torch.tensor([1.0, float("nan")], dtype=torch.bfloat16))
    assert all_finite(torch.tensor([1.0, 2.0], dtype=torch.float16))
    assert all_finite(torch.tensor([1, 2], dtype=torch.int64))


def test_check_finite_must_be_bool() -> None:
    from sparse2d.errors import ConfigError

    with pytest.raises(ConfigError, match="check_finite='no'"):
        SyncOptions(check_finite="no")  # type: ignore[arg-type]
