"""What fault tolerance refuses among the sync options, and why: decided from the options
alone, so the trainer's config check (``python -m sparse2d.train.config --check``, run by
the launch scripts before any process starts) refuses them without importing torch,
TorchRec or the sync engines; ``sparse2d.ft.replica_sync.refuse`` raises the same on every
rank before anything connects."""

from __future__ import annotations

from typing import Any

from sparse2d.sync.options import SyncOptions

REASONS = {
    "sharding_strategy": "a group would hold 1/G of the buffers: nothing to heal a lost group from",
    "sync.overlap": "an overlapped average is still in flight at the step boundary, where "
    "torchft forms the next quorum: it would span two quorums (a group healed into the next "
    "step holds no part of it, a group lost after the vote breaks an average its step already "
    "committed), and a step's commit vote can only cover collectives that finished before it",
    "sync.delayed_optimizer_state": "the states' average would finish one step late, across "
    "the boundary where torchft forms the next quorum: as with overlap, a step's commit vote "
    "can only cover collectives that finished before it, and an average spanning two quorums "
    "has members that joined or left in between",
    "sync.include_optimizer_state": "a heal and the average carry the optimizer state; groups "
    "must agree on it",
}
"""Why fault tolerance refuses an option (one copy: ``refuse`` and the trainer's config)."""


def option_refusals(options: SyncOptions, fully_sharded: bool) -> list[tuple[str, Any, str]]:
    """The options fault tolerance refuses, as ``(key, value, why)`` with keys relative to the
    trainer's ``parallel`` section; decided from the options alone, so the trainer refuses
    them when it loads its config and ``refuse`` on every rank before anything connects."""
    values = {
        "sharding_strategy": "fully_sharded" if fully_sharded else None,
        "sync.overlap": options.overlap or None,
        "sync.delayed_optimizer_state": options.delayed_optimizer_state or None,
        "sync.include_optimizer_state": False if not options.include_optimizer_state else None,
    }
    return [(key, value, REASONS[key]) for key, value in values.items() if value is not None]
