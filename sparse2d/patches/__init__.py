"""Every workaround of TorchRec, FBGEMM, torch or glibc behaviour, in one place.

One module per upstream file patched; each states the upstream ``file:line``, the issue, what
breaks without it and how its ``needed()`` probe tells whether the installed version still
behaves that way, and applies only while it does. ``apply_all()`` applies them (idempotent):
``DMPCollection`` calls it before sharding. A patch with a ``trigger`` is applied where the
trigger says instead. ``tests/test_patches.py`` fails on the TorchRec release that fixes one
(its probe turns False): drop that patch. ``python -m sparse2d.patches`` prints the table of
``docs/patches.md``.
"""

from __future__ import annotations

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
PATCHES: list[Patch] = [patch for module in MODULES for patch in module.PATCHES]

__all__ = ["PATCHES", "Patch", "apply_all", "table"]


def apply_all() -> list[str]:
    """Apply every patch without a trigger whose probe says it is still needed (safe to call
    many times); returns the names of those in force."""
    active = []
    for patch in PATCHES:
        if patch.trigger is None and patch.needed():
            patch.apply()
            active.append(patch.name)
    return active


def table() -> str:
    """The markdown table of ``docs/patches.md``, written from the registry."""
    rows = [
        "| patch | upstream file:line | issue | probe (`needed()`) | what breaks without it |",
        "|---|---|---|---|---|",
    ]
    for p in PATCHES:
        name = f"`{p.name}`" + (f" (applied by {p.trigger})" if p.trigger else "")
        rows.append(f"| {name} | `{p.upstream}` | {p.issue} | {p.probe} | {p.breaks} |")
    return "\n".join(rows) + "\n"
