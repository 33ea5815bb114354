"""Merge the identity tables of one MCH shard's replicas into one (pure, no collectives).

Every replica computes ``merge`` on the same gathered inputs, so all agree: metadata combined
per id (counts as the agreed baseline plus each replica's increase; last access the max), the
``Z - 1`` ids with the best eviction score survive, survivors keep a row they held where they
can (few rows move), and ``sources[g, r]`` says where replica ``g`` holds new row ``r``'s id
(-1: nowhere). The rules in full: docs/managed_collision.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from sparse2d.errors import ConfigError

INT64_MAX = torch.iinfo(torch.int64).max
INT64_MIN = torch.iinfo(torch.int64).min
POLICIES = ("lfu", "lru", "distance_lfu")


@dataclass
class Identity:
    """One replica's (or the merged) identity table of a ``Z``-slot shard."""

    sorted_ids: torch.Tensor
    """``(Z,)`` raw ids ascending; ``INT64_MAX`` for empty slots and the last (sentinel)."""
    rows: torch.Tensor
    """``(Z,)`` local row (``mapping - output_global_offset``) of each sorted id."""
    metadata: dict[str, torch.Tensor]
    """``counts`` and/or ``last_access_iter``, ``(Z,)`` each, aligned with ``sorted_ids``."""


@dataclass
class Merged:
    identity: Identity
    sources: torch.Tensor
    """``(G, Z)``: the local row holding new row ``r``'s id on replica ``g``, or -1."""
    holders: torch.Tensor
    """``(Z,)``: replicas holding each new row's id (0 for empty rows)."""


def score(
    policy: str, metadata: dict[str, torch.Tensor], current_iter: int, decay: float
) -> torch.Tensor:
    """The eviction score TorchRec's policy gives (higher survives), as float64."""
    if policy == "lfu":
        return metadata["counts"].double()
    distance = (current_iter - metadata["last_access_iter"] + 1).double().clamp(min=1) ** decay
    if policy == "lru":
        return -distance
    return metadata["counts"].double() / distance


def merge(
    replicas: list[Identity],
    baseline: Identity | None,
    policy: str,
    current_iter: int,
    decay: float = 1.0,
) -> Merged:
    """The identity table every replica adopts, and where each new row's id lives now.

    Runs in NumPy on CPU views of the tensors: ~60 small array ops per table and sync, each
    ~1 us there against ~5-10 us of torch dispatch (the merge was ~10% of a fault-tolerant
    MCH worker's main thread on 400-slot shards); the score is the policy's, in torch."""
    if policy not in POLICIES:
        raise ConfigError(f"unknown MCH eviction policy {policy!r}; expected one of {POLICIES}")
    size = replicas[0].sorted_ids.numel()
    groups = len(replicas)
    # Flatten the valid entries of every replica (the sentinel and empty slots hold MAX).
    ids, rows, owner = [], [], []
    meta: dict[str, list[np.ndarray]] = {k: [] for k in replicas[0].metadata}
    for g, rep in enumerate(replicas):
        sorted_ids = rep.sorted_ids.numpy()
        valid = sorted_ids != INT64_MAX
        ids.append(sorted_ids[valid])
        rows.append(rep.rows.numpy()[valid])
        owner.append(np.full(int(valid.sum()), g, dtype=np.int64))
        for key in meta:
            meta[key].append(rep.metadata[key].numpy()[valid])
    flat_ids, flat_rows, flat_owner = (
        np.concatenate(ids),
        np.concatenate(rows),
        np.concatenate(owner),
    )
    uniq, inverse = np.unique(flat_ids, return_inverse=True)
    merged_meta = _combined_metadata(meta, baseline, flat_ids, inverse, uniq.size)
    # Survivors: the best Z - 1 by the policy's score; uniq ascending makes ties go to small ids.
    scores = score(
        policy, {k: torch.from_numpy(v) for k, v in merged_meta.items()}, current_iter, decay
    )
    order = torch.argsort(scores, descending=True, stable=True).numpy()
    keep = np.zeros(uniq.size, dtype=bool)
    keep[order[: size - 1]] = True
    placed, taken = _place_rows(keep, inverse, flat_rows, flat_owner, size, groups)
    # Where each new row's id lives on each replica.
    sources = np.full((groups, size), -1, dtype=np.int64)
    held = keep[inverse]
    sources[flat_owner[held], placed[inverse[held]]] = flat_rows[held]
    sources[:, size - 1] = size - 1
    holders = (sources >= 0).sum(0, dtype=np.int64)
    # The merged table: survivors ascending, then empty rows ascending, then the sentinel.
    survivors = np.flatnonzero(keep)
    empty = np.flatnonzero(~taken)
    fill = np.full(empty.size + 1, INT64_MAX, dtype=np.int64)
    tail = np.zeros(empty.size + 1, dtype=np.int64)
    identity = Identity(
        sorted_ids=torch.from_numpy(np.concatenate([uniq[survivors], fill])),
        rows=torch.from_numpy(np.concatenate([placed[survivors], empty, [size - 1]])),
        metadata={
            k: torch.from_numpy(np.concatenate([v[survivors], tail]))
            for k, v in merged_meta.items()
        },
    )
    return Merged(
        identity=identity, sources=torch.from_numpy(sources), holders=torch.from_numpy(holders)
    )


def _combined_metadata(
    meta: dict[str, list[np.ndarray]],
    baseline: Identity | None,
    flat_ids: np.ndarray,
    inverse: np.ndarray,
    unique: int,
) -> dict[str, np.ndarray]:
    """Each id's metadata over the replicas holding it: counts are the baseline plus every
    replica's increase since; last access is the max."""
    merged: dict[str, np.ndarray] = {}
    if "counts" in meta:
        counts = np.concatenate(meta["counts"])
        base = _baseline_counts(baseline, flat_ids)
        delta = np.where(counts >= base, counts - base, counts)
        first = np.full(unique, INT64_MIN, dtype=np.int64)
        np.maximum.at(first, inverse, base)  # every id has at least one holder
        merged["counts"] = first + _sum_by(inverse, delta, unique)
    if "last_access_iter" in meta:
        last = np.full(unique, INT64_MIN, dtype=np.int64)
        np.maximum.at(last, inverse, np.concatenate(meta["last_access_iter"]))
        merged["last_access_iter"] = last
    return merged


def _place_rows(
    keep: np.ndarray,
    inverse: np.ndarray,
    flat_rows: np.ndarray,
    flat_owner: np.ndarray,
    size: int,
    groups: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(row of each unique id, -1 if evicted; rows taken): a survivor keeps its row on the
    lowest replica where that row is still free, the rest fill the free rows ascending."""
    placed = np.full(keep.size, -1, dtype=np.int64)
    taken = np.zeros(size, dtype=bool)
    taken[size - 1] = True  # the sentinel's row
    for g in range(groups):
        mine = flat_owner == g
        cand, row = inverse[mine], flat_rows[mine]
        ok = keep[cand] & (placed[cand] < 0) & ~taken[row]
        placed[cand[ok]] = row[ok]
        taken[row[ok]] = True
    free = np.flatnonzero(~taken)
    waiting = np.flatnonzero(keep & (placed < 0))
    placed[waiting] = free[: waiting.size]
    taken[free[: waiting.size]] = True
    return placed, taken


def _sum_by(index: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """``out[i] = sum(values[index == i])``, in int64 (exact)."""
    out = np.zeros(size, dtype=np.int64)
    np.add.at(out, index, values)
    return out


def _baseline_counts(baseline: Identity | None, ids: np.ndarray) -> np.ndarray:
    """Each id's count agreed at the previous sync (0 for ids it did not hold)."""
    if baseline is None or "counts" not in baseline.metadata or ids.size == 0:
        return np.zeros_like(ids)
    known = baseline.sorted_ids[:-1].numpy()
    if known.size == 0:
        return np.zeros_like(ids)
    at = np.searchsorted(known, ids).clip(max=known.size - 1)
    hit = known[at] == ids
    return np.where(hit, baseline.metadata["counts"].numpy()[at], 0)
