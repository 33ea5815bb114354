"""Sync MP-ZCH tables (TorchRec's ``HashZchManagedCollisionModule``) over a replica group.

TorchRec 1.8's ``DMPCollection._sync_mcc_modules`` semantics (replica 0's identities first,
the others inserted in replica order, rows averaged over the replicas that hold their id),
computed by every replica from an all-gather (so it runs on CPU through ``zch_insert``), rows
rebuilt from zeros, and every optimizer state moved with its row: docs/managed_collision.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
from torchrec.distributed.mc_modules import ShardedManagedCollisionCollection
from torchrec.modules.hash_mc_modules import HashZchManagedCollisionModule

from sparse2d.patches.torchrec_hash_mc_modules import zch_insert
from sparse2d.sync.shards import ShardState

_ALWAYS_EVICT = 2**31 - 1


@dataclass
class ZchTable:
    """One local shard of an MP-ZCH table: its remapper and its embedding shards."""

    name: str
    module: HashZchManagedCollisionModule
    shards: list[ShardState]


@dataclass
class ZchMerged:
    """Per new row: the local row each replica contributes (-1: none) and how many do."""

    sources: list[torch.Tensor]
    holders: torch.Tensor


def _offset(module: HashZchManagedCollisionModule) -> int:
    tensor = module._output_global_offset_tensor
    return int(tensor.item()) if tensor is not None else 0


def find_zch_tables(model: nn.Module, shards: list[ShardState]) -> list[ZchTable]:
    """Pair every sharded MP-ZCH module in ``model`` with the shards of ``shards`` it remaps to."""
    tables: list[ZchTable] = []
    for sub in model.modules():
        if not isinstance(sub, ShardedManagedCollisionCollection):
            continue
        for name, mc in sub._managed_collision_modules.items():
            if not isinstance(mc, HashZchManagedCollisionModule):
                continue
            offset, size = _offset(mc), int(mc._zch_size)
            mine = [
                s for s in shards if s.table == name and s.row_offset == offset and s.rows == size
            ]
            if mine:
                tables.append(ZchTable(name, mc, mine))
    return tables


def zch_identity_buffers(tables: list[ZchTable]) -> list[torch.Tensor]:
    """The live identity and metadata buffers of ``tables`` (for broadcasts)."""
    out: list[torch.Tensor] = []
    for table in tables:
        out.append(table.module._hash_zch_identities.data)
        if table.module._hash_zch_metadata is not None:
            out.append(table.module._hash_zch_metadata)
    return out


def _mapped(module: HashZchManagedCollisionModule, ids: torch.Tensor) -> tuple:
    """``(ids, local sizes, offsets)`` as the module's kernel calls see them."""
    return module.input_mapper(values=ids, output_offset=module._output_global_offset_tensor)


def merge_identities(
    module: HashZchManagedCollisionModule,
    identities: list[torch.Tensor],
    metadata: list[torch.Tensor] | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """TorchRec's ``sync_identities`` merge: replica 0's table, then each other replica's ids
    inserted with their metadata, evicting staler ids (metadata) in their probe window."""
    merged = identities[0].clone()
    merged_meta = metadata[0].clone() if metadata is not None else None
    for index in range(1, len(identities)):
        ids = identities[index].view(-1)
        keep = ids != -1
        values, sizes, offsets = _mapped(module, ids[keep])
        zch_insert(
            values,
            merged,
            max_probe=module.max_probe,
            local_sizes=sizes,
            offsets=offsets,
            metadata=merged_meta,
            input_metadata=metadata[index].view(-1)[keep] if metadata is not None else None,
            eviction_threshold=_ALWAYS_EVICT if metadata is not None else -1,
            eviction_policy=module.eviction_flag if metadata is not None else 0,
            disable_fallback=True,
        )
    return merged, merged_meta


def rank_to_global(
    module: HashZchManagedCollisionModule, local: torch.Tensor, merged: torch.Tensor
) -> torch.Tensor:
    """Per local slot, the merged slot of the id it holds (-1: empty or dropped), looked up
    by FBGEMM's read-only kernel, as TorchRec's ``sync_identities`` does."""
    ids = local.view(-1)
    out = torch.full_like(ids, -1)
    keep = ids != -1
    if bool(keep.any()):
        values, sizes, offsets = _mapped(module, ids[keep])
        out[keep] = torch.ops.fbgemm.zero_collision_hash(
            input=values,
            identities=merged,
            max_probe=module.max_probe,
            circular_probe=True,
            exp_hours=-1,
            readonly=True,
            local_sizes=sizes,
            offsets=offsets,
            disable_fallback=True,
        )[0]
    return out


def plan_rows(maps: list[torch.Tensor], size: int) -> ZchMerged:
    """From each replica's ``rank_to_global``: who contributes which row to each new row."""
    sources: list[torch.Tensor] = []
    device = maps[0].device if maps else torch.device("cpu")  # the module's (CPU or GPU)
    holders = torch.zeros(size, dtype=torch.int64, device=device)
    for mapping in maps:
        source = torch.full((size,), -1, dtype=torch.int64, device=device)
        moved = mapping >= 0
        source[mapping[moved]] = torch.nonzero(moved).view(-1)
        holders += (source >= 0).to(torch.int64)
        sources.append(source)
    return ZchMerged(sources, holders)


def merge_tables(
    tables: list[ZchTable], gathered: list[torch.Tensor]
) -> tuple[list[ZchMerged], list[tuple[torch.Tensor, torch.Tensor | None]]]:
    """Merge every table from the gathered packs (the same on every replica)."""
    merges: list[ZchMerged] = []
    adopted: list[tuple[torch.Tensor, torch.Tensor | None]] = []
    at = 0
    for table in tables:
        module = table.module
        size = int(module._zch_size)
        has_meta = module._hash_zch_metadata is not None
        ids = [g[at : at + size].view(size, 1) for g in gathered]
        meta = (
            [g[at + size : at + 2 * size].view(size, 1).to(torch.int32) for g in gathered]
            if has_meta
            else None
        )
        at += size * (2 if has_meta else 1)
        merged, merged_meta = merge_identities(module, ids, meta)
        merges.append(plan_rows([rank_to_global(module, i, merged) for i in ids], size))
        adopted.append((merged, merged_meta))
    return merges, adopted


def pack(tables: list[ZchTable]) -> torch.Tensor:
    """This replica's identities (and metadata), flat int64."""
    device = tables[0].module._hash_zch_identities.device if tables else torch.device("cpu")
    parts = [torch.zeros(0, dtype=torch.int64, device=device)]
    for table in tables:
        parts.append(table.module._hash_zch_identities.detach().view(-1).to(torch.int64))
        if table.module._hash_zch_metadata is not None:
            parts.append(table.module._hash_zch_metadata.view(-1).to(torch.int64))
    return torch.cat(parts)


def merge_zch(tables: list[ZchTable], gathered: list[torch.Tensor]) -> tuple[list, Callable]:
    """Merge every replica's packed identities: (row plans, the call that adopts the merged
    identities, run when the sync part lands)."""
    merges, adopted = merge_tables(tables, gathered)

    def land() -> None:
        with torch.no_grad():
            for table, (ids, meta) in zip(tables, adopted, strict=True):
                table.module._hash_zch_identities.data.copy_(ids)
                if meta is not None:
                    table.module._hash_zch_metadata.copy_(meta)

    return merges, land
