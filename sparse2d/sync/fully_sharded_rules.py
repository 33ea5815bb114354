"""The sync options FULLY_SHARDED replaces, stated once (pure, no torch).

Kept outside the ``sync.fully_sharded`` package, whose import loads torch and TorchRec: the
trainer's config check (run by the launch scripts before any process starts) imports only
this; ``fully_sharded.checks`` raises the library's error from the same list.
"""

from __future__ import annotations

from sparse2d.sync.options import SyncOptions

FIXED = ("every", "overlap", "compression", "delayed_optimizer_state", "momentum_scaling")
"""Options FULLY_SHARDED replaces: they must keep ``SyncOptions``' defaults."""


WHY = (
    "it averages weights and optimizer state by a dense reduce-scatter after every step, "
    "after a NaN/inf vote (no cadence, sparse engine, overlap, compression, state scaling "
    "or skipped checks)"
)


def fully_sharded_conflicts(sync_options: SyncOptions) -> list[str]:
    """``name=value`` of each option FULLY_SHARDED refuses (``fully_sharded.checks`` says why)."""
    default = SyncOptions()
    changed = [n for n in FIXED if getattr(sync_options, n) != getattr(default, n)]
    changed += [
        n for n in ("include_optimizer_state", "check_finite") if not getattr(sync_options, n)
    ]
    changed += ["engine"] if sync_options.engine == "sparse" else []
    return [f"{n}={getattr(sync_options, n)!r}" for n in changed]
