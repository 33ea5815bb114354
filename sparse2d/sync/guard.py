"""The NaN/inf guard of replica sync: one bad replica must never poison the others.

Averaging would spread a non-finite value to every replica (and, through a checkpoint, to
later runs). Before a sync sends anything each rank scans its payload and the whole job sums
one flag per rank over the global group, so every rank (not only the bad replica group, whose
peers would hang) raises ``SyncError`` and no averaged value is written back. The vote runs
behind the payload's average and is waited for before write-back. The scan is one ``sum`` per
buffer (a finite sum proves every element finite); only a non-finite sum pays for the exact
check ``(x * 0).sum()``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from sparse2d.comm_device import flag_device
from sparse2d.errors import SyncError
from sparse2d.sync.ballot import Ballot, Flag
from sparse2d.sync.shards import ShardState

NON_FINITE = Flag("non_finite")
"""This rank found a NaN/inf in what it sends; any rank: nobody writes the average back (the
flag of the ballots that carry a NaN/inf vote among others: fault tolerance's, FULLY_SHARDED's)."""
GUARD = Ballot(NON_FINITE)
"""FULLY_SHARDED's NaN/inf vote (``core.fully_sharded.schedule``); a sync's own vote is one int
all-reduced by ``FiniteGuard.start``."""


def all_finite(tensor: torch.Tensor) -> bool:
    """True when every element of ``tensor`` is finite (integer tensors always are)."""
    if tensor.numel() == 0 or not tensor.is_floating_point():
        return True
    flat = tensor.reshape(-1)
    if bool(torch.isfinite(flat.sum(dtype=torch.float32))):
        return True
    return bool(torch.isfinite(flat.mul(0).sum(dtype=torch.float32)))


def bad_tables(shards: Sequence[ShardState], weights: bool, states: bool) -> list[str]:
    """``"table (weight)"`` / ``"table (optimizer state)"`` for each local shard holding
    a non-finite value (the exact, slow scan: run only once a payload failed)."""
    found: list[str] = []
    for shard in shards:
        if weights and not all_finite(shard.weight):
            found.append(f"{shard.table} (weight)")
        if states and not all(all_finite(t) for t in shard.optimizer_states):
            found.append(f"{shard.table} (optimizer state)")
    return list(dict.fromkeys(found))


class FiniteGuard:
    """Checks sync payloads for NaN/inf and makes every rank of ``global_pg`` agree."""

    def __init__(self, shards: Sequence[ShardState], global_pg: dist.ProcessGroup) -> None:
        self.shards = list(shards)
        self.global_pg = global_pg
        self.world = dist.get_world_size(global_pg)
        self._device = self.shards[0].weight.device if self.shards else torch.device("cpu")
        flags_at = flag_device(global_pg)
        if flags_at.type == "cuda" and self._device.type != "cuda":
            self._device = flags_at

    def start(
        self, step: int, buffers: Sequence[torch.Tensor], *, weights: bool, states: bool
    ) -> Verdict:
        """Scan ``buffers`` (what this rank is about to send) and start the job-wide vote: one
        int per rank, SUM all-reduced over ``global_pg`` in the background.

        Collective over ``global_pg``: every rank calls it at the same sync. The caller may
        start its (copy-buffer) transfers and must call ``Verdict.wait`` before writing any
        averaged value back.
        """
        bad = False
        for buffer in buffers:
            if not all_finite(buffer):
                bad = True
                break
        flag = torch.tensor([int(bad)], dtype=torch.int32, device=self._device)
        work = dist.all_reduce(flag, dist.ReduceOp.SUM, self.global_pg, async_op=True)
        return Verdict(self, step, flag, work, bad, weights, states)


class Verdict:
    """The job-wide outcome of one NaN/inf vote (``FiniteGuard.start``), in flight."""

    def __init__(
        self,
        guard: FiniteGuard,
        step: int,
        flag: torch.Tensor,
        work: dist.Work,
        bad: bool,
        weights: bool,
        states: bool,
    ) -> None:
        self._guard, self._step, self._flag, self._work = guard, step, flag, work
        self._bad, self._weights, self._states = bad, weights, states

    def wait(self) -> None:
        """Raise ``SyncError`` (on every rank alike) if any rank found a non-finite value
        (collective over the guard's group only then)."""
        self._work.wait()
        if int(self._flag.item()):
            raise_non_finite(
                self._guard, self._step, self._bad, weights=self._weights, states=self._states
            )


def raise_non_finite(
    guard: FiniteGuard, step: int, local_bad: bool, *, weights: bool, states: bool
) -> None:
    """Name the bad tables and ranks on every rank (one object all-gather), then raise.

    Collective over ``guard.global_pg``: called by every rank once the vote said some
    rank is bad."""
    mine = bad_tables(guard.shards, weights, states) if local_bad else []
    if local_bad and not mine:  # the payload copy was bad but the live tensors are not
        mine = ["(sync payload)"]
    every: list[list[str] | None] = [None] * guard.world
    dist.all_gather_object(every, mine, group=guard.global_pg)
    global_ranks = [dist.get_global_rank(guard.global_pg, r) for r in range(guard.world)]
    ranks = [r for r in range(guard.world) if every[r]]
    where = "; ".join(f"rank {global_ranks[r]}: {', '.join(every[r] or ['?'])}" for r in ranks)
    tables = sorted({t.split(" (")[0] for r in ranks for t in every[r] or []})
    raise SyncError(
        f"sync at step {step}: non-finite values (NaN/inf) in table(s) "
        f"{', '.join(tables)} held by global rank(s) {[global_ranks[r] for r in ranks]} "
        f"({where}); nothing was written back, no replica changed. Find the cause "
        "(learning rate, bad input rows, a faulty device), then restore from the last "
        "checkpoint or a healthy replica (DMPCollection.repair_from_replicas)."
    )
