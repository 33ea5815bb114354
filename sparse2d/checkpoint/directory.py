"""The checkpoint directory: complete ``step_*`` checkpoints, the ``latest`` pointer, pruning.

Pure filesystem bookkeeping with no collectives, kept apart from ``dcp.py`` (which moves
tensors) so it can be read, tested and called on one rank without a process group.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid

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
