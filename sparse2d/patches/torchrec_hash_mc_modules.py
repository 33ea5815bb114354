"""MP-ZCH inserts on CPU: FBGEMM's CPU ``zero_collision_hash`` only looks ids up.

Upstream: torchrec/modules/hash_mc_modules.py:429 (``HashZchManagedCollisionModule._zero_collision_hash``
calls ``torch.ops.fbgemm.zero_collision_hash``; training remaps call it with
``readonly=False``, :685), whose CPU kernel refuses inserts ("Expected readonly to be true").
Issue: none found (searched: zero_collision_hash CPU readonly; FBGEMM's
https://github.com/pytorch/FBGEMM/pull/5570 notes the CPU version ignores metadata).
Without it: an MP-ZCH table cannot train on CPU: its first training forward fails.
Probe: ``needed()`` runs FBGEMM's CPU kernel on a one-id insert into an empty table and checks
that it still raises or inserts nothing (probed once).
Fix: on CPU, read-only lookups go to FBGEMM's kernel and inserts to ``zch_insert``; other
devices go to TorchRec.

``zch_insert`` is the insert in plain torch, one id after the other: a serial run of FBGEMM's
CUDA kernel (``faster_hash.cu``, v1.8.0), which probes circularly from
``murmur_hash3(id) % size`` for at most ``max_probe`` slots and takes the first slot that holds
the id or is empty; with eviction (threshold policy 0: TTL; policy 1: LRU) a full window gives
up the slot whose metadata is expired and older than the id's. The start slot comes from
FBGEMM itself (its read-only lookup on an empty table falls back to ``hash % size``), so the
table built here is one FBGEMM's read-only lookup resolves identically. The MP-ZCH replica
merge (``sparse2d.managed_collision.zch_sync``) inserts through it too, on every device.
Regression test: ``tests/test_patches_torchrec_hash_mc_modules.py``.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from typing import Any

import torch

from sparse2d.patches._base import Patch, is_patched, mark

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
        slot = _probe(
            table,
            meta,
            item,
            (base, first, size, max_probe),
            stamp,
            eviction_threshold,
            eviction_policy,
        )
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


def _window(values: list[int], base: int, first: int, size: int, probe: int) -> list[int]:
    """``values`` of the slots probed circularly from ``first`` in ``[base, base + size)``, in
    probe order; a window longer than ``size`` revisits slots, which changes no result."""
    n = min(probe, size)
    head = min(n, size - first)
    return values[base + first : base + first + head] + values[base : base + n - head]


def _first(values: list[int], item: int, base: int, first: int, size: int, end: int) -> int:
    """Probe step (< ``end``) of the first slot holding ``item`` in the window, else ``end``:
    ``list.index`` over the window's one or two runs of slots, at C speed."""
    head = min(end, size - first)
    try:
        return values.index(item, base + first, base + first + head) - base - first
    except ValueError:
        pass
    try:
        return values.index(item, base, base + end - head) - base + head
    except ValueError:
        return end


def _probe(
    table: list[int],
    meta: list[int] | None,
    item: int,
    where: tuple[int, int, int, int],
    stamp: int,
    threshold: int,
    policy: int,
) -> int | None:
    """The slot ``item`` takes in its window (None: fall back), FBGEMM's CUDA order: the first
    slot holding ``item`` or empty; before it, with metadata, policy 0 takes the first
    expired slot unless ``item`` is held (FBGEMM pre-checks the window up to the first empty
    slot: a held id is never evicted for); policy 1 takes the oldest expired slot only when
    no slot holds ``item`` or is empty. ``where``: (base, first, size, max_probe).

    The window is searched by ``list.index`` (C speed, ``_first``): the identity merge of an
    MP-ZCH sync inserts every replica's ids one after the other, most of them held already."""
    base, first, size, probe = where
    end = min(probe, size)
    held = _first(table, item, base, first, size, end)
    empty = _first(table, _EMPTY, base, first, size, end)
    found = min(held, empty)
    # without metadata, a held id, policy 1 with a free slot: that slot, no metadata read
    if meta is None or held < empty or (policy != 0 and found < end):
        return None if found == end else base + (first + found) % size
    ages = _window(meta, *where)
    if policy == 0:
        for step in range(found):
            if threshold > ages[step] and ages[step] < stamp:
                return base + (first + step) % size
        return None if found == end else base + (first + found) % size
    if policy != 1:
        return None
    oldest, oldest_stamp = None, _MAX_HOURS
    for step, seen in enumerate(ages):
        if threshold > seen and seen < stamp and seen < oldest_stamp:
            oldest, oldest_stamp = step, seen
    return None if oldest is None else base + (first + oldest) % size


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


def _inserting_on_cpu(original: Callable[..., Any]) -> Callable[..., Any]:
    names = list(inspect.signature(original).parameters)[1:]  # after self

    def zero_collision_hash(self: Any, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        if self.device.type != "cpu":
            return original(self, *args, **kwargs)
        return zero_collision_hash_cpu(self, **dict(zip(names, args, strict=False)), **kwargs)

    return mark(zero_collision_hash, original)


def needed() -> bool:
    """Whether FBGEMM's CPU ``zero_collision_hash`` still cannot insert."""
    return not cpu_kernel_inserts()


def apply() -> None:
    """Route the remaps of CPU MP-ZCH modules through ``zero_collision_hash_cpu`` while
    FBGEMM's CPU kernel cannot insert (idempotent)."""
    from torchrec.modules.hash_mc_modules import HashZchManagedCollisionModule as Module

    if not is_patched(Module._zero_collision_hash) and needed():
        Module._zero_collision_hash = _inserting_on_cpu(Module._zero_collision_hash)  # type: ignore[method-assign]


PATCHES = (
    Patch(
        name="torchrec_hash_mc_modules",
        upstream="torchrec/modules/hash_mc_modules.py:429",
        issue="none found; CPU kernel limits noted in https://github.com/pytorch/FBGEMM/pull/5570",
        breaks="an MP-ZCH table cannot train on CPU (FBGEMM's CPU kernel refuses inserts)",
        probe="FBGEMM's CPU zero_collision_hash on a one-id insert still raises or inserts nothing",
        needed=needed,
        apply=apply,
        sites=(
            "torchrec.modules.hash_mc_modules:HashZchManagedCollisionModule._zero_collision_hash",
        ),
        devices=("cpu",),  # FBGEMM's CUDA kernel inserts
    ),
)
