"""Merge the identity tables of one MCH shard's replicas into one (pure, no collectives).

An ``MCHManagedCollisionModule`` shard of ``Z`` slots keeps its raw ids sorted in
``_mch_sorted_raw_ids`` (empty slots hold ``INT64_MAX``), the embedding row of each in
``_mch_remapped_ids_mapping`` and the eviction policy's metadata alongside
(``_mch_counts`` / ``_mch_last_access_iter``). The last sorted position is TorchRec's
sentinel: raw id ``INT64_MAX`` on the shard's last row, which every unknown id reads.

Every replica computes ``merge`` on the same gathered inputs, so all agree on the result:

* metadata per id combined over the replicas holding it: counts are the baseline agreed at
  the previous sync plus each replica's increase since (a count below the baseline means
  the id was evicted and re-inserted there: all of it is new); last access is the max;
* the ``Z - 1`` ids with the best eviction score survive (the policy's own score: counts
  for LFU, recency for LRU, counts over weighted distance for distance-LFU; ties to the
  smaller raw id);
* each survivor keeps the row it held on the lowest replica where that row is still free,
  the rest fill the free rows in ascending order (few rows move);
* ``sources[g, r]``: the row replica ``g`` holds new row ``r``'s id in, or -1; the sentinel
  row is held by every replica (it is trained by every miss, like a plain table's row).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sparse2d.errors import ConfigError

INT64_MAX = torch.iinfo(torch.int64).max
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
    """The identity table every replica adopts, and where each new row's id lives now."""
    if policy not in POLICIES:
        raise ConfigError(f"unknown MCH eviction policy {policy!r}; expected one of {POLICIES}")
    size = replicas[0].sorted_ids.numel()
    groups = len(replicas)
    # Flatten the valid entries of every replica (the sentinel and empty slots hold MAX).
    ids, rows, owner = [], [], []
    meta: dict[str, list[torch.Tensor]] = {k: [] for k in replicas[0].metadata}
    for g, rep in enumerate(replicas):
        valid = rep.sorted_ids != INT64_MAX
        ids.append(rep.sorted_ids[valid])
        rows.append(rep.rows[valid])
        owner.append(torch.full((int(valid.sum()),), g, dtype=torch.int64))
        for key in meta:
            meta[key].append(rep.metadata[key][valid])
    flat_ids, flat_rows, flat_owner = torch.cat(ids), torch.cat(rows), torch.cat(owner)
    uniq, inverse = torch.unique(flat_ids, return_inverse=True)
    merged_meta: dict[str, torch.Tensor] = {}
    if "counts" in meta:
        counts = torch.cat(meta["counts"])
        base = _baseline_counts(baseline, flat_ids)
        delta = torch.where(counts >= base, counts - base, counts)
        first = torch.zeros_like(uniq).scatter_reduce_(0, inverse, base, "amax", include_self=False)
        merged_meta["counts"] = first + torch.zeros_like(uniq).index_add_(0, inverse, delta)
    if "last_access_iter" in meta:
        last = torch.cat(meta["last_access_iter"])
        merged_meta["last_access_iter"] = torch.zeros_like(uniq).scatter_reduce_(
            0, inverse, last, "amax", include_self=False
        )
    # Survivors: the best Z - 1 by the policy's score; uniq ascending makes ties go to small ids.
    order = torch.argsort(
        score(policy, merged_meta, current_iter, decay), descending=True, stable=True
    )
    keep = torch.zeros(uniq.numel(), dtype=torch.bool)
    keep[order[: size - 1]] = True
    # Rows: a survivor keeps its row on the lowest replica where that row is still free.
    placed = torch.full((uniq.numel(),), -1, dtype=torch.int64)
    taken = torch.zeros(size, dtype=torch.bool)
    taken[size - 1] = True  # the sentinel's row
    for g in range(groups):
        mine = flat_owner == g
        cand, row = inverse[mine], flat_rows[mine]
        ok = keep[cand] & (placed[cand] < 0) & ~taken[row]
        placed[cand[ok]] = row[ok]
        taken[row[ok]] = True
    free = torch.nonzero(~taken).flatten()
    waiting = torch.nonzero(keep & (placed < 0)).flatten()
    placed[waiting] = free[: waiting.numel()]
    taken[free[: waiting.numel()]] = True
    # Where each new row's id lives on each replica.
    sources = torch.full((groups, size), -1, dtype=torch.int64)
    held = keep[inverse]
    sources[flat_owner[held], placed[inverse[held]]] = flat_rows[held]
    sources[:, size - 1] = size - 1
    holders = (sources >= 0).sum(0)
    # The merged table: survivors ascending, then empty rows ascending, then the sentinel.
    survivors = torch.nonzero(keep).flatten()
    empty = torch.nonzero(~taken).flatten()
    fill = torch.full((empty.numel() + 1,), INT64_MAX, dtype=torch.int64)
    identity = Identity(
        sorted_ids=torch.cat([uniq[survivors], fill]),
        rows=torch.cat([placed[survivors], empty, torch.tensor([size - 1])]),
        metadata={
            k: torch.cat([v[survivors], torch.zeros(empty.numel() + 1, dtype=torch.int64)])
            for k, v in merged_meta.items()
        },
    )
    return Merged(identity=identity, sources=sources, holders=holders)


def _baseline_counts(baseline: Identity | None, ids: torch.Tensor) -> torch.Tensor:
    """Each id's count agreed at the previous sync (0 for ids it did not hold)."""
    if baseline is None or "counts" not in baseline.metadata or ids.numel() == 0:
        return torch.zeros_like(ids)
    known = baseline.sorted_ids[:-1]
    at = torch.searchsorted(known, ids).clamp(max=max(known.numel() - 1, 0))
    if known.numel() == 0:
        return torch.zeros_like(ids)
    hit = known[at] == ids
    return torch.where(hit, baseline.metadata["counts"][at], torch.zeros_like(ids))
