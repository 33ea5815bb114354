"""The replica average of small shards, folded into DDP's gradient all-reduce.

A replica sync is one more rendezvous per step: on the 2-core gloo box one all-reduce
costs ~3.5 ms of wall time however small (4 processes take turns on the cores), while
adding 0.5 MB to DDP's world all-reduce costs nothing measurable (``bench/RESULTS.md``,
"fold"). So when the sync's whole payload is small, DDP's last bucket carries it: the
job-wide all-reduce gets one *region* per sync policy, holding one *slot* per replica
group (per shard position, ordered by the group's lowest global rank). Each rank writes
its live values into its own group's slot and zeros elsewhere; the sum over the job is,
in each slot, the sum over exactly that replica group, and divided by the number of
replicas it is the replica average. Exact: the same sum and division as the dense
engine's all-reduce (bit for bit with 2 replicas; summation order may differ in the
last bits with more). The NaN/inf vote rides the same all-reduce, so nothing is written
back unless the whole job is finite.

Cost: each rank sends the whole region (every position's slot) instead of its own shard,
so folding pays only while the region is small: ``FOLD_MAX_BYTES``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.distributed as dist

from sparse2d.comm_device import flag_device

FOLD_MAX_BYTES = 2 << 20
"""Largest region (all slots of one policy) folded into DDP's all-reduce (a constant, not an
environment variable: a variable that changes the transport would make two launches of one
config sync differently; ``engine="sparse"`` never folds). Measured
with ``bench/fold_bench.py`` (2-core gloo box, world 4, L=2, a 16 KB DDP bucket): folded /
separate = 0.59-0.64 at a 0.25 MB region, 0.62-0.74 at 1 MB, 0.82-0.86 at 4 MB, 1.64-1.71
at 16 MB (two runs). Half the
crossover or less, so a fold never costs more than the collective it saves; the extra
bytes per rank stay bounded (about twice the region) at any world size."""

FOLD_DTYPE = torch.float32
"""Folded payloads share DDP's bucket, so they must have its dtype (fp32 dense params)."""


class Foldable(Protocol):
    """What folding needs from a sync policy (``SyncPolicy``)."""

    replica_pg: dist.ProcessGroup

    @property
    def may_fold(self) -> bool:
        """This policy's cadence syncs can ever be folded (static options)."""

    def fold_numel(self, dtype: torch.dtype) -> int:
        """Elements this rank's folded payload has, or -1 if it has other dtypes."""


@dataclass(slots=True)
class FoldSlot:
    """Where one policy's values sit in the folded all-reduce (the same on every rank)."""

    offset: int
    """This rank's slot, from the start of the policy's region."""
    numel: int
    """This rank's slot size (its replica group's payload)."""
    total: int
    """The region: every replica group's slot."""
    replicas: int
    """Ranks per slot: the sum over the job divided by this is the replica average."""


@dataclass(slots=True)
class Folded:
    """A cadence sync whose payload rides DDP's all-reduce: built before it, landed after."""

    step: int
    states: bool
    """The optimizer state is folded too."""
    began: float = field(default_factory=time.perf_counter)
    build_s: float = 0.0
    """Seconds spent before the all-reduce (landing transfers, divergence, naming values)."""
    tensors: list[torch.Tensor] = field(default_factory=list)
    """The live views folded, in slot order."""
    waited: float = 0.0
    """Seconds the sync waited for transfers still in flight (landed before folding)."""
    divergence: float | None = None
    error: Exception | None = None
    """What went wrong on this rank while building (the job then lands nothing)."""
    mean: torch.Tensor | None = None
    """The replica average of ``tensors`` (flat), once the all-reduce is done and every
    rank folded; None if some rank could not."""

    @property
    def ok(self) -> bool:
        return self.error is None


def plan_folds(
    policies: list[Foldable], pg: dist.ProcessGroup, max_bytes: int | None = None
) -> list[FoldSlot | None]:
    """Per policy, its slot in the folded all-reduce, or None where it cannot fold.

    One all-gather of (payload size, replica group) per policy over ``pg`` (the whole
    job), so every rank computes the same layout. A policy folds only if every rank can
    (all values in ``FOLD_DTYPE``), the replicas of each group agree on the size and the
    region fits ``max_bytes`` (default ``FOLD_MAX_BYTES``, read at each call).
    """
    limit = FOLD_MAX_BYTES if max_bytes is None else max_bytes
    local = torch.tensor(
        [
            [p.fold_numel(FOLD_DTYPE) if p.may_fold else -1, min(_ranks(p.replica_pg))]
            for p in policies
        ],
        dtype=torch.int64,
        device=flag_device(pg),  # an NCCL-only group moves CUDA tensors only
    ).reshape(len(policies), 2)
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size(pg))]
    dist.all_gather(gathered, local, group=pg)
    gathered = [g.cpu() for g in gathered]
    me = dist.get_rank(pg)
    itemsize = torch.empty(0, dtype=FOLD_DTYPE).element_size()
    slots: list[FoldSlot | None] = []
    for i in range(len(policies)):
        rows = [(int(g[i, 0]), int(g[i, 1])) for g in gathered]
        sizes: dict[int, set[int]] = {}
        members: dict[int, int] = {}
        for numel, group in rows:
            sizes.setdefault(group, set()).add(numel)
            members[group] = members.get(group, 0) + 1
        agreed = all(len(s) == 1 and min(s) >= 0 for s in sizes.values())
        if not agreed or len(set(members.values())) != 1:
            slots.append(None)
            continue
        offsets, total = {}, 0
        for group in sorted(sizes):
            offsets[group], total = total, total + min(sizes[group])
        if total == 0 or total * itemsize > limit:
            slots.append(None)
            continue
        numel, group = rows[me]
        slots.append(FoldSlot(offsets[group], numel, total, members[group]))
    return slots


def write_slot(folded: Folded | None, slot: FoldSlot, region: torch.Tensor) -> None:
    """Copy the folded live values into this rank's slot and zero the rest of ``region``
    (all of it when this rank has nothing to fold)."""
    if folded is None or not folded.ok or not folded.tensors:
        region.zero_()
        return
    end = slot.offset + slot.numel
    region[: slot.offset].zero_()
    region[end:].zero_()
    torch.cat([t.detach().reshape(-1) for t in folded.tensors], out=region[slot.offset : end])


def write_back(folded: Folded) -> None:
    """Copy the replica average into the live views it was read from."""
    if folded.mean is None:
        raise RuntimeError("write_back needs the folded average (the all-reduce not done)")
    offset = 0
    with torch.no_grad():
        for tensor in folded.tensors:
            n = tensor.numel()
            tensor.copy_(folded.mean[offset : offset + n].view_as(tensor))
            offset += n


def _ranks(pg: dist.ProcessGroup) -> list[int]:
    return dist.get_process_group_ranks(pg)
