"""``sparse2d.patches.torch_ddp_comm_hook``: DDP's ``register_comm_hook`` routed on one
instance, on real one-rank DDP modules (a private gloo group each; no world needed).

The carrier end to end (a user's hook after it; opted out) is in ``tests/test_sync_ddp_carried_vote.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from sparse2d.patches._base import is_patched
from sparse2d.patches.torch_ddp_comm_hook import apply, needed, one_rank_ddp, routed


def test_ddp_still_refuses_a_second_comm_hook() -> None:
    """What the probe sees, seen directly: DDP keeps one hook per module."""
    ddp = one_rank_ddp()
    ddp.register_comm_hook(None, allreduce_hook)
    with pytest.raises(RuntimeError, match="can only be called once"):
        ddp.register_comm_hook(None, allreduce_hook)
    assert needed()


def test_apply_routes_one_instance_once_and_leaves_ddp_alone() -> None:
    first: list[tuple[object, Callable[..., Any]]] = []
    second: list[tuple[object, Callable[..., Any]]] = []
    ddp, other = one_rank_ddp(), one_rank_ddp()
    ddp.register_comm_hook(None, allreduce_hook)  # the carrier's own hook, in the real use
    assert apply(ddp, lambda state, hook: first.append((state, hook)))
    assert apply(ddp, lambda state, hook: second.append((state, hook)))  # idempotent
    ddp.register_comm_hook("state", allreduce_hook)  # a user's hook after the carrier
    ddp.register_comm_hook("again", allreduce_hook)
    assert first == [("state", allreduce_hook), ("again", allreduce_hook)] and second == []
    assert routed(ddp) and not routed(other)
    assert not is_patched(DistributedDataParallel.register_comm_hook)  # the class: untouched
    other.register_comm_hook(None, allreduce_hook)  # DDP's own registration, unrouted
    assert other._comm_hooks  # DDP recorded it itself
