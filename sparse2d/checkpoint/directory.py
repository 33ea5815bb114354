"""The checkpoint directory: complete ``step_*`` checkpoints, the ``latest`` pointer, pruning.

Pure filesystem bookkeeping with no collectives, kept apart from ``dcp.py`` (which moves
tensors) so it can be read, tested and called on one rank without a process group.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Mapping
from typing import Any

from sparse2d.errors import CheckpointError

MARKER = "COMPLETE.json"
LATEST = "latest"
PREFIX = "step_"


def step_of(name: str) -> int | None:
    if not name.startswith(PREFIX) or ".tmp-" in name or ".trash-" in name:
        return None
    digits = name[len(PREFIX) :]
    return int(digits) if digits.isdigit() else None


def list_checkpoints(path: str | os.PathLike[str]) -> list[str]:
    """Complete checkpoints under ``path`` (those with a completion marker), oldest first."""
    root = os.fspath(path)
    if not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        step = step_of(name)
        if step is not None and os.path.isfile(os.path.join(root, name, MARKER)):
            found.append((step, os.path.join(root, name)))
    return [p for _, p in sorted(found)]


def partial_saves(path: str | os.PathLike[str]) -> list[str]:
    """Saves under ``path`` that never completed (``step_N.tmp-*``: a save killed midway, or
    one in flight), by name; never loaded, and removed by the next ``prune``."""
    root = os.fspath(path)
    if not os.path.isdir(root):
        return []
    return sorted(n for n in os.listdir(root) if n.startswith(PREFIX) and ".tmp-" in n)


def latest(path: str | os.PathLike[str]) -> str | None:
    """The newest complete checkpoint under ``path``, or ``None``.

    Follows the ``latest`` pointer; if it is missing or names an incomplete directory
    (a crash between rename and pointer update), falls back to the newest complete one.
    """
    root = os.fspath(path)
    pointer = os.path.join(root, LATEST)
    if os.path.isfile(pointer):
        with open(pointer) as f:
            name = f.read().strip()
        candidate = os.path.join(root, name)
        if name and os.path.isfile(os.path.join(candidate, MARKER)):
            return candidate
    complete = list_checkpoints(root)
    return complete[-1] if complete else None


def prune(path: str | os.PathLike[str], keep: int) -> list[str]:
    """Delete all but the newest ``keep`` complete checkpoints and any stale partial saves.

    Never deletes the checkpoint ``latest`` points to. Call on one rank only (``save``
    calls it on rank 0 after the new checkpoint is complete). Returns what was deleted.
    """
    if keep < 1:
        raise CheckpointError(f"keep={keep} must be >= 1 (the number of checkpoints to retain)")
    root = os.fspath(path)
    newest = latest(root)
    complete = list_checkpoints(root)
    doomed = [p for p in complete[:-keep] if p != newest]
    doomed += [os.path.join(root, n) for n in os.listdir(root) if ".tmp-" in n or ".trash-" in n]
    for victim in doomed:
        if os.path.isdir(victim):
            shutil.rmtree(victim, ignore_errors=True)
        else:  # a stale ``latest.tmp-*`` pointer file
            with contextlib.suppress(OSError):
                os.remove(victim)
    return doomed


def write_atomic(target: str, text: str) -> None:
    tmp = f"{target}.tmp-{uuid.uuid4().hex[:8]}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def resolve_checkpoint(path: str) -> str:
    if os.path.isfile(os.path.join(path, MARKER)):
        return path
    found = latest(path)
    if found is None:
        raise CheckpointError(
            f"no complete checkpoint at {path!r}: expected a directory with {MARKER} or a root "
            f"holding step_* checkpoints; partial saves (*.tmp-*) are never loaded"
        )
    return found


def save_target(
    root: str, step: int | None, extra: Mapping[str, Any] | None, keep: int | None
) -> tuple[str, int]:
    """The root and step a save writes: ``root/step_N`` names both; else ``step``, else
    ``extra["step"]``, else latest + 1. Local checks only (every rank raises alike)."""
    named = step_of(os.path.basename(os.path.normpath(root)))
    if named is not None:  # given root/step_N: save as step N under root
        if step is not None and step != named:
            raise CheckpointError(f"save path {root!r} names step {named} but step={step}")
        root, step = os.path.dirname(os.path.normpath(root)), named
    if keep is not None and keep < 1:
        raise CheckpointError(f"keep={keep} must be >= 1 (the number of checkpoints to retain)")
    if step is None:
        given = (extra or {}).get("step")
        if isinstance(given, int):
            step = given
        else:
            newest = latest(root)
            step = 0 if newest is None else int(os.path.basename(newest)[len(PREFIX) :]) + 1
    if step < 0:
        raise CheckpointError(f"step={step} must be >= 0")
    return root, step


def publish(
    tmp: str, root: str, name: str, token: str, marker: dict[str, Any], keep: int | None
) -> None:
    """Rank 0: the marker, then ``tmp`` -> ``root/name`` and ``latest`` (an existing
    ``name`` is swapped out first and removed last), then pruning to ``keep``."""
    write_atomic(os.path.join(tmp, MARKER), json.dumps(marker, indent=1))
    final = os.path.join(root, name)
    trash = None
    if os.path.exists(final):
        trash = os.path.join(root, f"{name}.trash-{token}")
        os.rename(final, trash)
    os.rename(tmp, final)
    fsync_dir(root)
    write_atomic(os.path.join(root, LATEST), name)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)
    if keep is not None:
        prune(root, keep)
