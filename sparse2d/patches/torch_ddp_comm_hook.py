"""DDP keeps one comm hook per module: a user's hook after sparse2d's carrier would fail.

Upstream: torch/nn/parallel/distributed.py:2178 (``DistributedDataParallel.register_comm_hook``
hands the hook to the C++ reducer, whose ``Reducer::register_comm_hook`` refuses a second one:
"register_comm_hook or register_builtin_comm_hook can only be called once").
Issue: none found (searched: DDP register_comm_hook more than once, chain comm hooks); DDP's
documentation states the one-hook rule.
Without it: the NaN/inf vote and the folded small syncs ride DDP's last gradient bucket
through a comm hook of sparse2d's (``sparse2d.sync.ddp.carried_vote``), so a user's own
``register_comm_hook`` on the model's DDP module, called after the first ``maybe_sync``,
raises instead of replacing sparse2d's averaging with theirs.
Probe: ``needed()`` builds a one-rank DDP over a private gloo group (no world needed) and
checks that a second ``register_comm_hook`` still raises. It is the registry's check, not run
when a carrier attaches (~1 s a process on 2 cores): routing one instance is harmless even
where DDP would take a second hook.
Fix: on the one DDP instance a carrier attaches to, ``register_comm_hook`` is replaced by one
that hands the user's hook to the carrier's hook state: from then on it runs in place of the
carrier, and nothing is carried. Other DDP modules of the process are left as they are.
Trigger: not ``apply_all``: it patches one DDP instance, not a class, applied by
``sparse2d/sync/ddp/carried_vote.py`` when a carrier attaches. Opted out, no carrier
attaches: DDP keeps its own averaging and hook registration, and every sync votes in its own
collective (one more world collective per guarded sync: 7% of the main job's step on the
2-core box).
Regression tests: ``tests/test_sync_ddp_carried_vote.py`` (a user's hook after the carrier; opted
out), ``tests/test_patches_torch_ddp_comm_hook.py``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from sparse2d.patches._base import Patch

NAME = "torch_ddp_comm_hook"


def one_rank_ddp() -> DistributedDataParallel:
    """A DDP of one linear layer over a private one-rank gloo group (no ``init_process_group``)."""
    store = dist.HashStore()
    group = dist.ProcessGroup(store, 0, 1)
    backend = dist.ProcessGroupGloo(store, 0, 1)
    group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
    group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    return DistributedDataParallel(torch.nn.Linear(1, 1), process_group=group)


@functools.cache
def needed() -> bool:
    """Whether DDP still refuses a second comm hook on one module."""
    ddp = one_rank_ddp()  # sparse2d routes instances only: this one is DDP's own
    ddp.register_comm_hook(None, allreduce_hook)
    try:
        ddp.register_comm_hook(None, allreduce_hook)
    except RuntimeError:
        return True
    return False


def apply(
    ddp: DistributedDataParallel, route: Callable[[object, Callable[..., Any]], None]
) -> bool:
    """Send ``ddp``'s later ``register_comm_hook(state, hook)`` calls to ``route`` (idempotent:
    an instance routed once keeps its first route); True when ``ddp`` routes them."""
    if "register_comm_hook" in vars(ddp):
        return True
    ddp.register_comm_hook = route  # type: ignore[method-assign]
    return True


def routed(ddp: DistributedDataParallel) -> bool:
    """Whether ``ddp``'s ``register_comm_hook`` is sparse2d's route (not DDP's own)."""
    return "register_comm_hook" in vars(ddp)


PATCHES = (
    Patch(
        name=NAME,
        upstream="torch/nn/parallel/distributed.py:2178",
        issue="none found: DDP documents one comm hook per module",
        breaks="a user's DDP comm hook after the first maybe_sync raises (DDP allows one)",
        probe="a second register_comm_hook on a one-rank DDP still raises",
        needed=needed,
        apply=apply,
        sites=("torch.nn.parallel:DistributedDataParallel.register_comm_hook",),
        trigger="sparse2d/sync/ddp/carried_vote.py: the DDP module a carrier attaches to",
    ),
)
