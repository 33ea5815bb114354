"""Content checksums of checkpoint files: bytes garbled in place are caught before any load.

DCP's reader only trips over damage that breaks its parsing; a flipped bit inside a
tensor loads silently. At save time every rank hashes the files it wrote
(``__R_*.distcp``, DCP's per-rank naming), rank 0 adds the rest (``.metadata``) and
records ``{file: {"size", "sha256"}}`` in ``COMPLETE.json``. At load time the files
are verified in parallel (file ``i`` by rank ``i % world``) and every rank learns the
verdict, so all raise the same error, naming the file, before any weight changes.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import torch.distributed as dist

from sparse2d.sync.ballot import Ballot, Flag

_CHUNK = 1 << 22
MARKER_KEY = "files"
"""Where ``COMPLETE.json`` keeps the checksums."""
CORRUPT = Flag("corrupt")
"""A file this rank verified is missing, resized or altered; any rank: every rank raises."""
FILES = Ballot(CORRUPT)
"""The load's file check, voted over the world before the names travel."""


def file_digest(path: str) -> dict[str, Any]:
    """``{"size": bytes, "sha256": hex}`` of one file."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return {"size": size, "sha256": digest.hexdigest()}


def digest_files(directory: str) -> dict[str, dict[str, Any]]:
    """Checksums of every data file of a DCP save in ``directory`` (collective).

    Each rank hashes its own ``__{rank}_*`` files; rank 0 also hashes every file no rank
    claims. Returns the full map on rank 0 (others get their own part).
    """
    rank = dist.get_rank()
    names = sorted(os.listdir(directory))
    mine = {n: file_digest(os.path.join(directory, n)) for n in names if n.startswith(f"__{rank}_")}
    parts: list[dict[str, dict[str, Any]] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, mine)
    merged: dict[str, dict[str, Any]] = {}
    for part in parts:
        merged.update(part or {})
    if rank == 0:
        for name in names:
            if name not in merged and os.path.isfile(os.path.join(directory, name)):
                merged[name] = file_digest(os.path.join(directory, name))
    return merged


def verify_files(ckpt: str, marker: dict[str, Any], error: type[Exception]) -> None:
    """Raise ``error`` on every rank if a file listed in ``marker`` is missing, resized or
    altered (collective). Checkpoints written before checksums existed pass unverified."""
    expected: dict[str, dict[str, Any]] = marker.get(MARKER_KEY) or {}
    rank, world = dist.get_rank(), dist.get_world_size()
    problems: list[str] = []
    for index, (name, want) in enumerate(sorted(expected.items())):
        if index % world != rank:
            continue
        path = os.path.join(ckpt, name)
        if not os.path.isfile(path):
            problems.append(f"{name} is missing")
            continue
        size = os.path.getsize(path)
        if size != want["size"]:
            problems.append(f"{name} has {size} bytes, {want['size']} were written (truncated?)")
        elif file_digest(path)["sha256"] != want["sha256"]:
            problems.append(f"{name} does not match its sha256 (bytes changed since the save)")
    # cheap agreement first; the names only travel on failure
    if not FILES.start({CORRUPT.name: bool(problems)}, None).wait()[CORRUPT]:
        return
    every: list[list[str] | None] = [None] * world
    dist.all_gather_object(every, problems)
    found = sorted(p for part in every for p in part or [])
    raise error(
        f"checkpoint {ckpt!r} is corrupt: {'; '.join(found)}; nothing was loaded. Use an older "
        f"checkpoint (sparse2d.checkpoint.list_checkpoints) or restore the file from a copy."
    )


def agree_on_failure(failure: dict[int, str]) -> dict[int, str]:
    """Every rank learns which ranks failed a collective step, and why (collective)."""
    every: list[dict[int, str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(every, failure)
    merged: dict[int, str] = {}
    for part in every:
        merged.update(part or {})
    return dict(sorted(merged.items()))
