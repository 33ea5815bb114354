"""``sync.landing``: a started sync part's state machine and the points that land it.

The unit tests use real payloads and transfers whose average is already known (the
collective is not their subject); the mesh tests run real syncs on the shared 2x2 gloo
world (``world4``: 2 replicas of 2 ranks) and check each ``LandingPoint`` lands, a commit
writes the averages back and a discard leaves every shard's own values.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from sparse2d.ft.commit import Holding
from sparse2d.sync.engines.dense import DenseEngine
from sparse2d.sync.engines.rows import row_payload
from sparse2d.sync.landing import Landing, LandingPoint, PartState, Started
from sparse2d.sync.options import SyncOptions
from sparse2d.sync.plan import plan_sync
from sparse2d.sync.policy import SyncPolicy
from sparse2d.sync.shards import live_tensors
from sparse2d.sync.transport.channel import InWorldChannel
from sparse2d.sync.transport.transfer import Pending, Reduction
from tests.models import MIXED_TABLES, adagrad_2d, make_batch


class HeldInWorld(Holding, InWorldChannel):
    """The in-world replica group, its sync parts held until ``commit`` or ``discard``."""


class Recording(InWorldChannel):
    """The in-world replica group; remembers every part handed to it."""

    def __init__(self, pg: dist.ProcessGroup | None) -> None:
        super().__init__(pg)
        self.handed: list[Started] = []

    def hand(self, started: Started) -> None:
        self.handed.append(started)
        super().hand(started)


def _start(live: torch.Tensor, average: list[float], background: bool) -> Pending:
    """A transfer of ``live`` whose replica average is ``average``."""
    payload = row_payload([(live, None)])
    snapshot = [b.clone() for b in payload.buffers] if background else None
    mean = [torch.tensor(average)]
    return Pending(payload, Reduction([], lambda: mean), snapshot, "states")


def _landing(channel: InWorldChannel | None = None) -> Landing:
    channel = channel or InWorldChannel(None)
    return Landing(DenseEngine([], None), scaler=None, channel=channel)


def _place(
    landing: Landing, live: torch.Tensor, average: list[float], index: int = 0, **plan: bool
) -> Started:
    planned = plan_sync(states=True, **plan)  # type: ignore[arg-type]
    part = planned.parts[index]
    started = landing.start(part, _start(live, average, part.background), planned)
    landing.place(part, started, planned)
    return started


def test_now_hidden_and_background_parts_land_when_their_plan_says() -> None:
    landing, live = _landing(), torch.tensor([1.0, 2.0])
    flags = {"async_states": False, "hide": False, "copies": False}
    now = _place(landing, live, [3.0, 4.0], **flags)
    assert live.tolist() == [3.0, 4.0] and not landing.hidden
    assert now.state is PartState.LANDED and now.point is LandingPoint.SYNC

    hidden = _place(landing, live, [5.0, 6.0], **{**flags, "hide": True, "copies": True})
    assert live.tolist() == [3.0, 4.0] and len(landing.hidden) == 1  # before the next lookup
    assert landing.land(LandingPoint.LOOKUP) >= 0.0 and live.tolist() == [5.0, 6.0]
    assert not landing.hidden and hidden.point is LandingPoint.LOOKUP
    assert landing.take_hidden_wait() >= 0.0 and landing.take_hidden_wait() == 0.0

    background = {"async_states": True, "hide": True, "copies": False}  # delayed state
    delayed = _place(landing, live, [7.0, 8.0], 1, **background)
    assert not landing.hidden and len(landing.background) == 1
    live.add_(torch.tensor([1.0, 0.0]))  # training goes on while the all-reduce runs
    landing.land(LandingPoint.LOOKUP)  # the next lookup lets it run on
    assert delayed.state is PartState.STARTED and live.tolist() == [6.0, 6.0]
    landing.land(LandingPoint.CALL)
    assert live.tolist() == [8.0, 8.0]  # the average plus the update made meanwhile
    assert delayed.point is LandingPoint.CALL and not landing.background


def test_held_parts_wait_for_the_commit_or_are_dropped() -> None:
    channel = HeldInWorld(None)
    landing, live = _landing(channel), torch.tensor([1.0, 2.0])
    flags = {"async_states": False, "hide": False, "copies": True}
    first = _place(landing, live, [3.0, 4.0], **flags)
    assert live.tolist() == [1.0, 2.0] and channel.holding and first.state is PartState.HELD
    landing.land(LandingPoint.CALL)  # the policy's points do not land a held part
    assert live.tolist() == [1.0, 2.0] and channel.holding
    channel.commit()
    assert live.tolist() == [3.0, 4.0] and not channel.holding
    assert first.point is LandingPoint.RELEASE
    second = _place(landing, live, [9.0, 9.0], **flags)
    channel.discard()  # the step failed its commit: every shard keeps its own values
    assert live.tolist() == [3.0, 4.0] and not channel.holding
    assert second.state is PartState.DROPPED and second.point is None


def test_repeats_do_nothing_and_crossings_are_refused() -> None:
    live = torch.tensor([1.0, 2.0])
    landed, dropped = [], []
    part = Started(_start(live, [3.0, 4.0], False), lambda: landed.append(1), dropped.append)
    assert part.land(LandingPoint.CALL) >= 0.0 and part.land(LandingPoint.CLOSE) == 0.0
    assert landed == [1] and part.point is LandingPoint.CALL  # landed once, where it landed
    with pytest.raises(RuntimeError, match="cannot be dropped"):
        part.drop()
    with pytest.raises(RuntimeError, match="cannot be held"):
        part.hold()

    gone = Started(_start(live, [9.0, 9.0], False), dropped=dropped.append)
    gone.drop()
    gone.drop()
    assert dropped == [False] and live.tolist() == [3.0, 4.0]  # dropped once, never written
    with pytest.raises(RuntimeError, match="cannot land"):
        gone.land(LandingPoint.CALL)

    held = Started(_start(live, [5.0, 5.0], False), dropped=dropped.append)
    held.hold()
    with pytest.raises(RuntimeError, match="when its channel releases it"):
        held.land(LandingPoint.SURFACE)
    held.drop()
    assert dropped == [False, True] and live.tolist() == [3.0, 4.0]  # a held drop: diverged

    for point in (LandingPoint.SYNC, LandingPoint.RELEASE):  # only a channel lands these
        with pytest.raises(RuntimeError, match="through its channel"):
            _landing().land(point)


# ---- real syncs on the 2x2 gloo mesh ------------------------------------------------------


def _install(model, channel: InWorldChannel, **options: object) -> SyncPolicy:
    """A policy over ``channel`` as the model's own (its surfaces land it)."""
    local = model.sync_policy
    policy = SyncPolicy(
        local.shards,
        model.replica_pg,
        model.num_replicas,
        SyncOptions(engine="dense", **options),  # type: ignore[arg-type]
        global_pg=dist.group.WORLD,
        channel=channel,
    )
    local.close()
    model.sync_policy = policy
    return policy


def _diverge(model, shards) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Make each replica's values its own; return them and their replica average."""
    with torch.no_grad():
        for t in live_tensors(shards, True, True):
            t.add_(float(dist.get_rank()) + 1.0)
    own = [t.clone() for t in live_tensors(shards, True, True)]
    average = [t.clone() for t in own]
    for t in average:
        dist.all_reduce(t, op=dist.ReduceOp.AVG, group=model.replica_pg)
    return own, average


def _equal(shards, expected: list[torch.Tensor]) -> bool:
    for live, want in zip(live_tensors(shards, True, True), expected, strict=True):
        torch.testing.assert_close(live, want)
    return True


def check_each_point_lands() -> dict[str, list[str]]:
    """A hidden sync landed by each point that lands hidden parts, then a blocking one
    (``SYNC``): each part's point, and the average in every shard after it landed."""
    kjt, dense, _ = make_batch(MIXED_TABLES, 0, dist.get_rank())
    points = {
        "lookup": lambda model, policy: model(kjt, dense),
        "surface": lambda model, policy: model.state_dict(),
        "call": lambda model, policy: policy.finish(),
        "next sync": lambda model, policy: policy.sync_now(0),
        "close": lambda model, policy: policy.reset(),
    }
    out: dict[str, list[str]] = {}
    with adagrad_2d(engine="dense") as model:
        channel = Recording(model.replica_pg)
        policy = _install(model, channel, hide=True)
        shards = policy.shards
        for name, reach in points.items():
            _, average = _diverge(model, shards)
            channel.handed.clear()
            policy.step(0)  # hidden: in flight until a point lands it
            parts = list(policy.landing.hidden)
            assert parts and policy.in_flight and not channel.handed
            with torch.no_grad():
                reach(model, policy)
            assert not policy.in_flight and _equal(shards, average)
            out[name] = [p.point.value for p in parts if p.point is not None]
        _, average = _diverge(model, shards)
        policy.sync_now(0)  # blocking: the channel lands it before the sync returns
        assert _equal(shards, average)
        out["sync"] = [p.point.value for p in channel.handed if p.point is not None]
        policy.close()
    return out


def test_each_landing_point_lands(world4) -> None:
    for out in world4.run(check_each_point_lands):
        assert out == {
            "lookup": ["lookup"],
            "surface": ["surface"],
            "call": ["call"],
            "next sync": ["next sync"],
            "close": ["close"],
            "sync": ["sync"],
        }, out


def check_commit_and_discard() -> dict[str, list[str]]:
    """A held sync: untouched until its channel decides; ``commit`` lands the averages
    (``RELEASE``), ``discard`` leaves every shard's own values; a second decision finds
    nothing held."""
    out: dict[str, list[str]] = {}
    with adagrad_2d(engine="dense") as model:
        channel = HeldInWorld(model.replica_pg)
        policy = _install(model, channel)
        shards = policy.shards
        for outcome in ("discard", "commit"):
            own, average = _diverge(model, shards)
            policy.sync_now(0)
            held = list(channel.held)
            assert held and all(p.state is PartState.HELD for p in held)
            assert _equal(shards, own)  # in copies only
            model.state_dict()  # a surface lands nothing a channel holds
            assert _equal(shards, own) and channel.holding
            getattr(channel, outcome)()
            getattr(channel, outcome)()  # nothing held any more: nothing happens
            assert _equal(shards, own if outcome == "discard" else average)
            assert not channel.holding
            out[outcome] = [p.state.value + (f"@{p.point.value}" if p.point else "") for p in held]
        policy.close()
    return out


def test_commit_writes_averages_and_discard_keeps_own_values(world4) -> None:
    for out in world4.run(check_commit_and_discard):
        assert out == {"discard": ["dropped"], "commit": ["landed@release"]}, out
