"""Every workaround of TorchRec, FBGEMM, torch or glibc behaviour, in one place.

One module per upstream file patched; each states the upstream ``file:line``, the issue, what
breaks without it and how its ``needed()`` probe tells whether the installed version still
behaves that way, and applies only while it does. ``apply_all(device)`` applies them (idempotent):
``DMPCollection`` calls it before sharding, with its device: a patch scoped to other devices
(``Patch.devices``: the CPU-only workarounds for a CUDA model) is left out. A patch with a
``trigger`` is applied where the trigger says instead. ``opt_out(name, ...)`` (before the first
``DMPCollection``) keeps a patch from ever being applied; ``docs/patches.md`` says what breaks. ``RELEASES`` records, per version set of the Makefile (``TORCHREC=``),
which probes say "needed" there and at which upstream ``file:line``; ``tests/test_patches.py``
fails when the installed set answers otherwise (on the release that fixes one, its probe turns
False: drop the patch from that set's row) or has no row yet. ``python -m sparse2d.patches``
prints the table of ``docs/patches.md``.
"""

from __future__ import annotations

import logging

import torch

from sparse2d.errors import ConfigError
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
from sparse2d.patches._base import IN_FORCE, OPTED_OUT, Patch, is_patched, resolve

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

__all__ = [
    "PATCHES",
    "RELEASES",
    "Patch",
    "apply_all",
    "installed_release",
    "opt_in",
    "opt_out",
    "table",
]


def installed_release() -> str:
    """The installed torchrec's ``major.minor``: the key of its row in ``RELEASES``."""
    import torchrec

    return ".".join(torchrec.__version__.split(".")[:2])


def apply_all(device: torch.device | str | None = None) -> list[str]:
    """Apply every patch without a trigger that a model on ``device`` needs (its scope, not
    opted out, its probe still says needed); safe to call many times. ``device`` None: CUDA
    when this process can use it, else the CPU. Returns the names of those in force."""
    kind = torch.device(device).type if device is not None else _default_device_type()
    active = []
    for patch in PATCHES:
        if patch.trigger is not None or not patch.applies_to(kind) or not patch.wanted():
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
            IN_FORCE.add(patch.name)
            active.append(patch.name)
    return active


def opt_out(*names: str) -> None:
    """Never apply these patches in this process (by ``Patch.name``). Call it before the first
    ``DMPCollection``: a process-wide patch already in force cannot be taken back (that raises,
    as does an unknown name). docs/patches.md says what each one's absence breaks."""
    known = {p.name: p for p in PATCHES}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"no patch named {unknown}; the patches: {sorted(known)}")
    late = [n for n in names if n in IN_FORCE or _sites_patched(known[n])]
    if late:
        raise RuntimeError(
            f"patches {late} are in force already in this process (applied by an earlier "
            "DMPCollection); call sparse2d.patches.opt_out before the first one"
        )
    OPTED_OUT.update(names)


def opt_in(*names: str) -> None:
    """Undo ``opt_out`` for these patches: later models apply them again where needed."""
    OPTED_OUT.difference_update(names)


def _sites_patched(patch: Patch) -> bool:
    """A class-level site already wrapped (a trigger's instance patches have no such site)."""
    if patch.trigger is not None or not patch.sites_present():
        return False
    return any(is_patched(resolve(site)) for site in patch.sites)


def _default_device_type() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def table() -> str:
    """The markdown table of ``docs/patches.md``, written from the registry."""
    sets = " | ".join(f"needed on {r}" for r in RELEASES)
    rows = [
        f"| patch | devices | upstream file:line (1.8) | {sets} | issue | probe (`needed()`) | "
        "what breaks without it |",
        "|---|---|---|" + "---|" * len(RELEASES) + "---|---|---|",
    ]
    for p in PATCHES:
        name = f"`{p.name}`" + (f" (applied by {p.trigger})" if p.trigger else "")
        devices = "every" if p.devices is None else ", ".join(p.devices)
        needed = " | ".join(_needed_cell(p, r) for r in RELEASES)
        rows.append(
            f"| {name} | {devices} | `{p.upstream}` | {needed} | {p.issue} | {p.probe} "
            f"| {p.breaks} |"
        )
    return "\n".join(rows) + "\n"


def _needed_cell(patch: Patch, release: str) -> str:
    where = RELEASES[release].get(patch.name)
    if where is None:
        return "no (fixed upstream)"
    return f"yes, `:{where.rsplit(':', 1)[1]}`"
