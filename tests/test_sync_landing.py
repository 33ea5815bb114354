"""``sync.landing``: where started averages wait and how they land, with real payloads and
transfers whose average is already known (no process group: the collective is not the
subject here; the policies' tests run them on real gloo meshes)."""

from __future__ import annotations

import torch

from sparse2d.sync.engines.dense import DenseEngine
from sparse2d.sync.engines.rows import row_payload
from sparse2d.sync.landing import Landing
from sparse2d.sync.plan import plan_sync
from sparse2d.sync.transport.transfer import Pending, Reduction


def _start(live: torch.Tensor, average: list[float], background: bool) -> Pending:
    """A transfer of ``live`` whose replica average is ``average``."""
    payload = row_payload([(live, None)])
    snapshot = [b.clone() for b in payload.buffers] if background else None
    mean = [torch.tensor(average)]
    return Pending(payload, Reduction([], lambda: mean), snapshot, "states")


def _landing() -> Landing:
    return Landing(DenseEngine([], None), scaler=None)


def test_now_hidden_and_background_parts_land_when_their_plan_says() -> None:
    landing, live = _landing(), torch.tensor([1.0, 2.0])
    now = plan_sync(states=True, async_states=False, hide=False, copies=False)
    landing.place(now.parts[0], _start(live, [3.0, 4.0], False), now, deferred=False)
    assert live.tolist() == [3.0, 4.0] and not landing.hidden

    hidden = plan_sync(states=True, async_states=False, hide=True, copies=True)
    landing.place(hidden.parts[0], _start(live, [5.0, 6.0], False), hidden, deferred=False)
    assert live.tolist() == [3.0, 4.0] and len(landing.hidden) == 1  # before the next lookup
    assert landing.land() >= 0.0 and live.tolist() == [5.0, 6.0] and not landing.hidden
    assert landing.take_hidden_wait() >= 0.0 and landing.take_hidden_wait() == 0.0

    delayed = plan_sync(states=True, async_states=True, hide=True, copies=False)
    landing.place(delayed.parts[1], _start(live, [7.0, 8.0], True), delayed, deferred=False)
    assert not landing.hidden and len(landing.background) == 1
    live.add_(torch.tensor([1.0, 0.0]))  # training goes on while the all-reduce runs
    landing.finish()
    assert live.tolist() == [8.0, 8.0]  # the average plus the update made meanwhile


def test_deferred_parts_wait_for_the_commit_or_are_dropped() -> None:
    landing, live = _landing(), torch.tensor([1.0, 2.0])
    plan = plan_sync(states=True, async_states=False, hide=False, copies=True)
    landing.place(plan.parts[0], _start(live, [3.0, 4.0], False), plan, deferred=True)
    assert live.tolist() == [1.0, 2.0] and landing.uncommitted
    landing.commit()
    assert live.tolist() == [3.0, 4.0] and not landing.uncommitted
    landing.place(plan.parts[0], _start(live, [9.0, 9.0], False), plan, deferred=True)
    landing.discard()  # the step failed its commit: every shard keeps its own values
    assert live.tolist() == [3.0, 4.0] and not landing.uncommitted
