"""MP-ZCH inserts on CPU: FBGEMM's CPU ``zero_collision_hash`` only looks ids up.

TorchRec's ``HashZchManagedCollisionModule`` inserts ids in training through
``torch.ops.fbgemm.zero_collision_hash(readonly=False)``; FBGEMM's CPU kernel refuses that
("Expected readonly to be true"). ``zch_insert`` is the insert in plain torch, one id after
the other: a serial run of FBGEMM's CUDA kernel (``faster_hash.cu``, v1.8.0), which probes
circularly from ``murmur_hash3(id) % size`` for at most ``max_probe`` slots and takes the
first slot that holds the id or is empty; with eviction (threshold policy 0: TTL; policy 1:
LRU) a full window gives up the slot whose metadata is expired and older than the id's. The
start slot comes from FBGEMM itself (its read-only lookup on an empty table falls back to
``hash % size``), so the table built here is one FBGEMM's read-only lookup resolves
identically (``tests/test_sync_mc_zch_insert.py`` checks it). It is installed only where
``cpu_kernel_inserts()`` (a probe of the kernel, not a version check) says FBGEMM cannot.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch

_EMPTY = -1
_MAX_HOURS = 2**31 - 1


@functools.cache
def cpu_kernel_inserts() -> bool:
    """Whether FBGEMM's CPU ``zero_collision_hash`` can insert (probed once)."""
    identities = torch.full((4, 1), _EMPTY, dtype=torch.int64)
    try:
        torch.ops.fbgemm.zero_collision_hash(
            input=torch.tensor([7], dtype=torch.int64),
            identities=identities,
            max_probe=4,
            circular_probe=True,
            exp_hours=-1,
            readonly=False,
        )
    except RuntimeError:
        return False
    return bool((identities == 7).any())


def start_slots(
    values: torch.Tensor,
    size: int,
    local_sizes: torch.Tensor | None,
    offsets: torch.Tensor | None,
) -> torch.Tensor:
    """``murmur_hash3(id) % local size + offset`` per id, computed by FBGEMM's own kernel."""
    empty = torch.full((size, 1), _EMPTY, dtype=torch.int64)
    return torch.ops.fbgemm.zero_collision_hash(
        input=values,
        identities=empty,
        max_probe=1,
        circular_probe=True,
        exp_hours=-1,
        readonly=True,
        local_sizes=local_sizes,
        offsets=offsets,
        disable_fallback=False,
    )[0]


def zch_insert(
    values: torch.Tensor,
    identities: torch.Tensor,
    *,
    max_probe: int,
    local_sizes: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    metadata: torch.Tensor | None = None,
    input_metadata: torch.Tensor | None = None,
    eviction_threshold: int = -1,
    eviction_policy: int = 0,
    disable_fallback: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Insert ``values`` into ``identities`` (and ``metadata``) in place, as FBGEMM's CUDA
    ``zero_collision_hash(readonly=False)`` does; returns ``(slots, evicted slots or None)``."""
    if identities.dtype != values.dtype:
        raise ValueError(
            f"zch_insert: ids are {values.dtype} but identities {identities.dtype}; "
            "TorchRec's MP-ZCH keeps int64 identities for int64 ids."
        )
    evict = eviction_threshold > 0 or eviction_policy > 0
    if evict and metadata is None:
        raise ValueError("zch_insert: eviction needs the metadata buffer")
    total = identities.size(0)
    start = start_slots(values, total, local_sizes, offsets).tolist()
    ids = values.tolist()
    sizes = local_sizes.tolist() if local_sizes is not None else [total] * len(ids)
    bases = offsets.tolist() if offsets is not None else [0] * len(ids)
    cur_hour = (int(time.time()) // 3600) % _MAX_HOURS
    stamps = input_metadata.reshape(-1).tolist() if input_metadata is not None else None
    table = identities.view(-1).tolist()  # Python lists: one id after the other is a loop
    meta = metadata.view(-1).tolist() if metadata is not None else None
    out: list[int] = []
    evicted: list[int] = []
    for index, item in enumerate(ids):
        size, base = int(sizes[index]), int(bases[index])
        first = int(start[index]) - base
        stamp = int(stamps[index]) if stamps is not None else cur_hour
        window = _Window(base, first, size, max_probe)
        slot = _probe(table, meta, item, window, stamp, eviction_threshold, eviction_policy)
        if slot is None:
            out.append(-1 if disable_fallback else base + first)
            continue
        if table[slot] != item and table[slot] != _EMPTY:
            evicted.append(slot)
        table[slot] = item
        if meta is not None:
            meta[slot] = max(meta[slot], stamp)
        out.append(slot)
    identities.view(-1).copy_(torch.tensor(table, dtype=identities.dtype))
    if metadata is not None and meta is not None:
        metadata.view(-1).copy_(torch.tensor(meta, dtype=metadata.dtype))
    slots = torch.tensor(out, dtype=torch.int64)
    if not evict:
        return slots, None
    return slots, torch.unique(torch.tensor(evicted, dtype=torch.int64))


class _Window:
    """The ``max_probe`` slots probed circularly from ``first`` in ``[base, base + size)``."""

    __slots__ = ("base", "first", "size", "probe")

    def __init__(self, base: int, first: int, size: int, probe: int) -> None:
        self.base, self.first, self.size, self.probe = base, first, size, probe

    def __iter__(self):  # noqa: ANN204 - a plain generator of slots
        base, first, size = self.base, self.first, self.size
        return (base + (first + step) % size for step in range(self.probe))


def _probe(
    table: list[int],
    meta: list[int] | None,
    item: int,
    window: _Window,
    stamp: int,
    threshold: int,
    policy: int,
) -> int | None:
    """The slot ``item`` takes in ``window`` (None: fall back), FBGEMM's CUDA order."""
    # FBGEMM pre-checks the window up to the first empty slot: a held id is never evicted for.
    present = False
    for slot in window:
        if table[slot] == _EMPTY:
            break
        if table[slot] == item:
            present = True
            break
    oldest, oldest_stamp = None, _MAX_HOURS
    for slot in window:
        value = table[slot]
        if value == item or value == _EMPTY:
            return slot
        if meta is None:
            continue
        seen = meta[slot]
        expired = threshold > seen and seen < stamp
        if policy == 0 and not present and expired:
            return slot
        if policy == 1 and expired and seen < oldest_stamp:
            oldest, oldest_stamp = slot, seen
    return oldest if policy == 1 else None


def zero_collision_hash_cpu(module: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """``HashZchManagedCollisionModule._zero_collision_hash`` for CPU: FBGEMM's kernel for
    read-only lookups, ``zch_insert`` for inserts."""
    del module
    if kwargs["readonly"]:
        lookup = {
            k: kwargs[k]
            for k in ("input", "identities", "max_probe", "circular_probe", "local_sizes")
        }
        lookup.update(offsets=kwargs["offsets"], disable_fallback=kwargs["disable_fallback"])
        return torch.ops.fbgemm.zero_collision_hash(exp_hours=-1, readonly=True, **lookup)
    if kwargs.get("opt_in_prob", -1) != -1 or kwargs.get("runtime_meta") is not None:
        raise NotImplementedError("zch_insert: opt_in_prob and runtime_meta are not supported")
    return zch_insert(
        kwargs["input"],
        kwargs["identities"],
        max_probe=kwargs["max_probe"],
        local_sizes=kwargs["local_sizes"],
        offsets=kwargs["offsets"],
        metadata=kwargs["metadata"],
        input_metadata=kwargs["input_metadata"],
        eviction_threshold=kwargs["eviction_threshold"],
        eviction_policy=kwargs["eviction_policy"],
        disable_fallback=kwargs["disable_fallback"],
    )


def install_cpu_insert(model: torch.nn.Module) -> int:
    """Route the inserts of every CPU MP-ZCH module in ``model`` through ``zch_insert``
    while FBGEMM's CPU kernel cannot insert; returns how many modules were routed."""
    from torchrec.modules.hash_mc_modules import HashZchManagedCollisionModule

    if cpu_kernel_inserts():
        return 0
    routed = 0
    for sub in model.modules():
        if isinstance(sub, HashZchManagedCollisionModule) and sub.device.type == "cpu":
            sub._zero_collision_hash = functools.partial(zero_collision_hash_cpu, sub)
            routed += 1
    return routed
