"""Every workaround of TorchRec, FBGEMM, torch or glibc behaviour, in one place.

One module per upstream file patched; each states the upstream ``file:line``, the issue, what
breaks without it and how its ``needed()`` probe tells whether the installed version still
behaves that way, and applies only while it does. ``apply_all()`` applies them (idempotent):
``DMPCollection`` calls it before sharding. A patch with a ``trigger`` is applied where the
trigger says instead. ``RELEASES`` records, per version set of the Makefile (``TORCHREC=``),
which probes say "needed" there and at which upstream ``file:line``; ``tests/test_patches.py``
fails when the installed set answers otherwise (on the release that fixes one, its probe turns
False: drop the patch from that set's row) or has no row yet. ``python -m sparse2d.patches``
prints the table of ``docs/patches.md``.
"""

from __future__ import annotations

import logging

from sparse2d.patches import (
    fbgemm_tbe_training,
    glibc_malloc,
    torchrec_comm,
    torchrec_comm_ops,
    torchrec_distributed_utils,
    torchrec_hash_mc_modules,
    torchrec_jagged_tensor,
    torchrec_runtime_forwards,
    torchrec_train_pipelines,
)
from sparse2d.patches._base import Patch

MODULES = (
    torchrec_comm_ops,
    torchrec_comm,
    torchrec_distributed_utils,
    torchrec_train_pipelines,
    torchrec_runtime_forwards,
    torchrec_jagged_tensor,
    torchrec_hash_mc_modules,
    fbgemm_tbe_training,
    glibc_malloc,
)
_log = logging.getLogger(__name__)
PATCHES: list[Patch] = [patch for module in MODULES for patch in module.PATCHES]

RELEASES: dict[str, dict[str, str]] = {
    "1.8": {p.name: p.upstream for p in PATCHES},
    "1.9": {
        "torchrec_comm_ops": "torchrec/distributed/comm_ops.py:2743",
        "torchrec_comm": "torchrec/distributed/comm.py:292",
        "torchrec_distributed_utils": "torchrec/distributed/utils.py:603",
        "torchrec_train_pipelines.cpu_streams": (
            "torchrec/distributed/train_pipeline/train_pipelines.py:1989"
        ),
        "torchrec_train_pipelines.early_lookup": (
            "torchrec/distributed/train_pipeline/train_pipelines.py:1703"
        ),
        "torchrec_runtime_forwards": "torchrec/distributed/train_pipeline/runtime_forwards.py:89",
        "torchrec_jagged_tensor": "torchrec/sparse/jagged_tensor.py:3755",
        "torchrec_hash_mc_modules": "torchrec/modules/hash_mc_modules.py:429",
        "fbgemm_tbe_training": "fbgemm_gpu/split_table_batched_embeddings_ops_training.py:4581",
        "glibc_malloc": "glibc malloc/malloc.c:_int_free",
    },
}
"""Version set (``TORCHREC=1.8``: torchrec 1.8.0, fbgemm 1.8.0, torch 2.13.0; ``1.9``: torchrec
1.9.2, fbgemm 1.9.0, torch 2.14.1) -> the patches whose probes say "needed" there, each with
its upstream ``file:line`` in that set (``Patch.upstream`` is 1.8's). A patch missing from a
row is one that set fixed: its probe says so and ``apply_all`` leaves it out there."""

__all__ = ["PATCHES", "RELEASES", "Patch", "apply_all", "installed_release", "table"]


def installed_release() -> str:
    """The installed torchrec's ``major.minor``: the key of its row in ``RELEASES``."""
    import torchrec

    return ".".join(torchrec.__version__.split(".")[:2])


def apply_all() -> list[str]:
    """Apply every patch without a trigger whose probe says it is still needed (safe to call
    many times); returns the names of those in force."""
    active = []
    for patch in PATCHES:
        if patch.trigger is not None:
            continue
        if not patch.sites_present():
            _log.warning(
                "patch %s not applied: %s is missing in this TorchRec/FBGEMM (%s is what "
                "sparse2d is tested on, docs/patches.md)",
                patch.name,
                ", ".join(patch.sites),
                " / ".join(RELEASES),
            )
            continue
        if patch.needed():
            patch.apply()
            active.append(patch.name)
    return active


def table() -> str:
    """The markdown table of ``docs/patches.md``, written from the registry."""
    sets = " | ".join(f"needed on {r}" for r in RELEASES)
    rows = [
        f"| patch | upstream file:line (1.8) | {sets} | issue | probe (`needed()`) | "
        "what breaks without it |",
        "|---|---|" + "---|" * len(RELEASES) + "---|---|---|",
    ]
    for p in PATCHES:
        name = f"`{p.name}`" + (f" (applied by {p.trigger})" if p.trigger else "")
        needed = " | ".join(_needed_cell(p, r) for r in RELEASES)
        rows.append(f"| {name} | `{p.upstream}` | {needed} | {p.issue} | {p.probe} | {p.breaks} |")
    return "\n".join(rows) + "\n"


def _needed_cell(patch: Patch, release: str) -> str:
    where = RELEASES[release].get(patch.name)
    if where is None:
        return "no (fixed upstream)"
    return f"yes, `:{where.rsplit(':', 1)[1]}`"
