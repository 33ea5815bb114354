"""glibc keeps freed large CPU buffers resident: pin its mmap threshold (process-wide).

Upstream: glibc malloc/malloc.c:_int_free (freeing an mmapped chunk raises
``mp_.mmap_threshold``: the dynamic threshold of mallopt(3), M_MMAP_THRESHOLD, which
``mallopt(M_MMAP_THRESHOLD = -3, bytes)`` from ``malloc.h`` pins).
Issue: none: glibc's documented design (dynamic adjustment stops once the threshold is set);
related: https://github.com/pytorch/pytorch/issues/169160 (CPU memory not returned to the OS).
Without it: after FULLY_SHARDED's first step the full TBE buffers (and gloo's temporaries)
come from the heap and stay resident after ``resize_(0)``, so the memory FULLY_SHARDED frees
is not returned (measured: RSS between steps above DEFAULT).
Probe: ``needed()`` checks that the C library is glibc (``gnu_get_libc_version`` resolves) and
that the user has not pinned the threshold (``MALLOC_MMAP_THRESHOLD_`` or
``glibc.malloc.mmap_threshold`` in ``GLIBC_TUNABLES``); measuring RSS is too slow and noisy.
Fix: ``mallopt(M_MMAP_THRESHOLD, 1 MiB)``, once per process.
Trigger: not ``apply_all``: process-wide allocator tuning is applied only where it pays, by
``sparse2d.core.fully_sharded.schedule`` when FULLY_SHARDED slices CPU buffers.
Measured by: ``bench/fully_sharded_bench.py`` (RSS between steps, FULLY_SHARDED vs DEFAULT).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

from sparse2d.patches._base import IN_FORCE, Patch

logger = logging.getLogger(__name__)
_M_MMAP_THRESHOLD = -3  # mallopt parameter number in glibc's malloc.h
THRESHOLD = 1 << 20
_state = {"applied": False}


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def needed() -> bool:
    """Whether the process runs glibc with its dynamic mmap threshold (not pinned by the user)."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") is not None:
        return False
    if "glibc.malloc.mmap_threshold" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    libc = _libc()
    return libc is not None and hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt")


def apply() -> bool:
    """Pin glibc's mmap threshold so freed large CPU buffers go back to the OS; True once it
    is pinned (idempotent: ``mallopt`` runs once per process)."""
    if _state["applied"]:
        return True
    if not needed():
        return False
    libc = _libc()
    done = libc is not None and bool(libc.mallopt(_M_MMAP_THRESHOLD, THRESHOLD))
    if done:
        _state["applied"] = True
        IN_FORCE.add("glibc_malloc")
        logger.info("[sparse2d] FULLY_SHARDED: glibc mmap threshold fixed at %d bytes", THRESHOLD)
    return done


PATCHES = (
    Patch(
        name="glibc_malloc",
        upstream="glibc malloc/malloc.c:_int_free",
        issue="none: documented glibc behaviour",
        breaks="memory FULLY_SHARDED frees on CPU stays resident (RSS above DEFAULT)",
        probe="libc is glibc and MALLOC_MMAP_THRESHOLD_/GLIBC_TUNABLES do not pin the threshold",
        needed=needed,
        apply=apply,
        trigger="sparse2d/core/fully_sharded/schedule.py: FULLY_SHARDED over CPU buffers",
        devices=("cpu",),
    ),
)
