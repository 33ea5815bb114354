"""The replica channel (``sparse2d.sync.transport.channel``) on a real 2x2 gloo mesh: a
channel that holds (``sparse2d.ft.commit.Holding`` over the in-world group) averages into
copies; ``commit`` writes the average back, ``discard`` keeps each replica's own values.
(torchft's managed channel runs in tests/test_ft_fault_tolerant_steps.py.)"""

from __future__ import annotations

import torch
import torch.distributed as dist

from sparse2d.ft.commit import Holding
from sparse2d.sync.policy import SyncPolicy
from sparse2d.sync.shards import live_tensors
from sparse2d.sync.transport.channel import InWorldChannel
from tests.models import adagrad_2d


class HeldInWorld(Holding, InWorldChannel):
    """The in-world replica group, its sync parts held for a commit (a loop that votes on
    its steps itself)."""


def _held(model) -> tuple[SyncPolicy, HeldInWorld]:
    local = model.sync_policy
    policy = SyncPolicy(
        local.shards,
        model.replica_pg,
        model.num_replicas,
        local.options,
        global_pg=dist.group.WORLD,
        channel=HeldInWorld(model.replica_pg),
    )
    local.close()
    return policy, policy.channel


def check_commit_and_discard() -> dict:
    with adagrad_2d(engine="dense") as model:
        policy, channel = _held(model)
        shards = policy.shards
        out = {}
        for outcome in ("discard", "commit"):
            with torch.no_grad():  # replicas differ: each rank's own values
                for t in live_tensors(shards, True, True):
                    t.add_(float(dist.get_rank()) + 1.0)
            own = [t.clone() for t in live_tensors(shards, True, True)]
            expected = []
            for t in own:
                avg = t.clone()
                dist.all_reduce(avg, op=dist.ReduceOp.AVG, group=model.replica_pg)
                expected.append(avg)
            policy.sync_now(0)
            live = live_tensors(shards, True, True)
            untouched = all(torch.equal(a, b) for a, b in zip(live, own, strict=True))
            waiting = channel.holding
            getattr(channel, outcome)()
            live = live_tensors(shards, True, True)
            target = own if outcome == "discard" else expected
            out[outcome] = {
                "untouched_before": untouched,
                "waiting": waiting,
                "landed": all(torch.equal(a, b) for a, b in zip(live, target, strict=True)),
                "left": channel.holding,
            }
        policy.close()
        return out


def test_holding_channel_commits_or_keeps_own_values(world4) -> None:
    for out in world4.run(check_commit_and_discard):
        for outcome, got in out.items():
            assert got == {
                "untouched_before": True,
                "waiting": True,
                "landed": True,
                "left": False,
            }, (outcome, got)
