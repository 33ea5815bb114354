"""Directories the trainer will write, checked before any process group forms.

A ``run_dir`` or ``checkpoint.dir`` the job cannot write used to surface at the first
metrics line or the first save, minutes in, on every rank, and then torchrun restarted the
group into the same error. ``check_writable`` probes each one (a temporary directory made
and removed in its nearest existing ancestor) from the launchers' config check and from
``check_runtime`` on every rank at start, and names the key and the fix in one line.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from sparse2d.errors import ConfigError


def unwritable(path: str) -> str | None:
    """Why ``path`` cannot be (made) a directory this process writes into; None if it can."""
    existing = os.path.abspath(path)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"{existing!r} is a file, not a directory"
    try:
        probe = tempfile.mkdtemp(prefix=".sparse2d-write-check-", dir=existing)
    except OSError as error:
        return f"cannot create a directory in {existing!r} ({error.strerror or error})"
    os.rmdir(probe)
    return None


def check_writable(cfg: Any) -> None:
    """``run_dir`` (metrics, plans, records) and, when checkpoints are saved, ``checkpoint.dir``."""
    problem = unwritable(cfg.run_dir)
    if problem:
        raise ConfigError(
            f"run_dir={cfg.run_dir!r}: {problem}: set run_dir to a directory this user can write."
        )
    if cfg.checkpoint.every > 0 and cfg.checkpoint.dir is not None:
        problem = unwritable(cfg.checkpoint.dir)
        if problem:
            raise ConfigError(
                f"checkpoint.dir={cfg.checkpoint.dir!r}: {problem}: set checkpoint.dir to a "
                "directory this user can write (or checkpoint.every=0 to save none)."
            )
