"""Sync MCH tables over a replica group: agree on identities, then average rows by id.

Between syncs each replica inserts and evicts its own ids, so slot-by-slot averaging would mix
different ids. One sync: all-gather the identity tables, merge them identically everywhere
(``managed_collision.merge``), one SUM all-reduce per dtype of each replica's row for every
new id (zeros where it lacks it), divided by the replicas holding it. Optimizer state always
travels with its row; rows whose id no replica keeps are zeroed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from sparse2d.comm_device import flag_device
from sparse2d.managed_collision.merge import Identity, Merged, merge
from sparse2d.managed_collision.tables import MCTable
from sparse2d.managed_collision.zch_sync import ZchTable, merge_zch, pack
from sparse2d.sync.shards import ShardState, by_dtype


def _metadata_keys(table: MCTable) -> list[str]:
    return sorted(table.module._mch_metadata)


def _meta(module: torch.nn.Module, key: str) -> torch.Tensor:
    """The live metadata buffer (by attribute: ``.to()``/loads replace buffer objects)."""
    return getattr(module, f"_mch_{key}")


def local_identity(table: MCTable) -> Identity:
    """A CPU copy of this replica's identity table of ``table``. Merges run on the CPU: a
    few small ops per table, each of whose boolean selections would wait for the GPU."""
    module = table.module

    def host(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to("cpu", copy=True)

    return Identity(
        sorted_ids=host(module._mch_sorted_raw_ids),
        rows=host(module._mch_remapped_ids_mapping) - table.offset,
        metadata={k: host(_meta(module, k)) for k in _metadata_keys(table)},
    )


def identity_buffers(tables: list[MCTable]) -> list[torch.Tensor]:
    """The live identity buffers of ``tables`` (for broadcasts: align, repair)."""
    out: list[torch.Tensor] = []
    for table in tables:
        module = table.module
        out += [module._mch_sorted_raw_ids, module._mch_remapped_ids_mapping]
        out += [_meta(module, k) for k in _metadata_keys(table)]
    return out


class ManagedCollisionSync:
    """Merges identities and averages rows by id for the MCH tables of one replica group."""

    def __init__(
        self,
        tables: list[MCTable],
        replica_pg: dist.ProcessGroup,
        zch_tables: list[ZchTable] | None = None,
        channel: Any = None,
    ) -> None:
        self.tables = tables
        self.zch_tables = zch_tables or []
        """MP-ZCH tables (``managed_collision.zch_sync``): merged TorchRec's way, rows averaged here."""
        self.replica_pg = replica_pg
        self.channel = channel
        """A managed channel (``sparse2d.ft.transport.ManagedChannel``: torchft's quorum)
        instead of ``replica_pg``; None: the replica process group."""
        self.baselines: list[Identity | None] = [None] * len(tables)

    @property
    def shards(self) -> list[ShardState]:
        return [s for t in [*self.tables, *self.zch_tables] for s in t.shards]

    def reset(self) -> None:
        """Take the current (replica-identical) identities as the count baseline."""
        self.baselines = [local_identity(t) for t in self.tables]

    def _gather(self, packed: torch.Tensor) -> tuple[list[torch.Tensor], int]:
        """Every replica's ``packed`` (and this replica's index among them), on the CPU."""
        if self.channel is not None:
            gathered, me = self.channel.all_gather(packed)
            return [g.cpu() for g in gathered], me
        groups = dist.get_world_size(self.replica_pg)
        packed = packed.to(flag_device(self.replica_pg))  # an NCCL group moves CUDA tensors
        gathered = [torch.empty_like(packed) for _ in range(groups)]
        dist.all_gather(gathered, packed, group=self.replica_pg)
        return [g.cpu() for g in gathered], dist.get_rank(self.replica_pg)

    def _sum(self, flat: torch.Tensor) -> None:
        if self.channel is not None:
            self.channel.sum(flat)
        else:
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.replica_pg)

    def prepare(self) -> tuple[int, Callable[[], None]]:
        """Merge identities, move rows and optimizer state, average by id, every result held
        in copies (collective over the replica group): (bytes sent, the call that writes the
        merged identities and averaged rows into the live tables, after which every replica
        is bit-identical). The policy hands that call to its channel, which lands it like any
        blocking part."""
        mine = [local_identity(t) for t in self.tables]
        mch_packed = torch.cat(
            [_pack(i, t) for i, t in zip(mine, self.tables, strict=True)]
            or [torch.zeros(0, dtype=torch.int64)]
        )
        zch_packed = pack(self.zch_tables).cpu()
        # One all-gather carries both kinds' identities (a separate one per kind cost a
        # collective per sync, for nothing when a model has only one kind).
        both = torch.cat([mch_packed, zch_packed])
        gathered, me = self._gather(both)
        sent = both.numel() * both.element_size() * (len(gathered) - 1)
        merges: list[Merged] = []
        at = 0
        for index, table in enumerate(self.tables):
            width = _packed_size(table)
            replicas = [_unpack(g[at : at + width], table) for g in gathered]
            current = int(max(g[at + width - 1] for g in gathered))
            at += width
            merges.append(
                merge(replicas, self.baselines[index], table.policy, current, table.decay)
            )
        # The merged identities are adopted by ``land``, with the rows, when the part lands.
        zch_merges, zch_land = merge_zch(self.zch_tables, [g[at:] for g in gathered])
        rows = [
            (t.shards, m.sources[me], m.holders)
            for t, m in [
                *zip(self.tables, merges, strict=True),
                *zip(self.zch_tables, zch_merges, strict=True),
            ]
        ]
        averaged, moved = self._average_rows(rows)
        sent += moved

        def land() -> None:
            zch_land()
            with torch.no_grad():
                for tensor, value in averaged:
                    tensor.copy_(value)
                for table, merged in zip(self.tables, merges, strict=True):
                    _adopt(table, merged.identity)
            self.baselines = [m.identity for m in merges]

        return sent, land

    def _average_rows(
        self, rows: list[tuple[list[ShardState], torch.Tensor, torch.Tensor]]
    ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int]:
        """Per ``(shards, source, holders)``: contribute each new row's id as held here
        (``source``: local row, -1 none), SUM over replicas, divide by ``holders``. Returns
        (live tensor, its new value) pairs, nothing written yet, and the bytes sent."""
        live: list[torch.Tensor] = []
        parts: list[torch.Tensor] = []
        divisors: list[torch.Tensor] = []
        with torch.no_grad():
            for shards, source, holders in rows:
                if not shards:
                    continue
                # gather, then zero the rows held elsewhere: no boolean selection, which on
                # a GPU would wait for the device
                device = shards[0].weight.device
                index, missing = source.clamp(min=0).to(device), (source < 0).to(device)
                count = holders.to(device)
                for shard in shards:
                    for tensor in [shard.weight, *shard.optimizer_states]:
                        part = tensor.index_select(0, index)
                        shape = (-1,) + (1,) * (tensor.dim() - 1)
                        part.masked_fill_(missing.view(shape), 0)
                        live.append(tensor)
                        parts.append(part)
                        divisors.append(count)
            sent = 0
            for dtype, group in by_dtype(parts).items():
                flat = torch.cat([p.reshape(-1) for p in group])
                self._sum(flat)
                sent += flat.numel() * flat.element_size()
                at = 0
                for part in group:
                    part.copy_(flat[at : at + part.numel()].view_as(part))
                    at += part.numel()
                del dtype
            averaged = []
            for tensor, part, holders in zip(live, parts, divisors, strict=True):
                shape = (-1,) + (1,) * (tensor.dim() - 1)
                count = holders.clamp(min=1).to(part.dtype).view(shape)
                averaged.append((tensor, part / count))
        return averaged, sent


def _packed_size(table: MCTable) -> int:
    return table.size * (2 + len(_metadata_keys(table))) + 1


def _pack(identity: Identity, table: MCTable) -> torch.Tensor:
    metadata = [identity.metadata[k] for k in _metadata_keys(table)]
    current = torch.tensor([max(int(table.module._current_iter), 0)], dtype=torch.int64)
    return torch.cat([identity.sorted_ids, identity.rows, *metadata, current])


def _unpack(flat: torch.Tensor, table: MCTable) -> Identity:
    size = table.size
    keys = _metadata_keys(table)
    return Identity(
        sorted_ids=flat[:size],
        rows=flat[size : 2 * size],
        metadata={k: flat[(2 + i) * size : (3 + i) * size] for i, k in enumerate(keys)},
    )


def _adopt(table: MCTable, identity: Identity) -> None:
    """Write the merged identity table into the live MCH buffers."""
    module = table.module
    module._mch_sorted_raw_ids.copy_(identity.sorted_ids)
    module._mch_remapped_ids_mapping.copy_(identity.rows + table.offset)
    for key in _metadata_keys(table):
        _meta(module, key).copy_(identity.metadata[key])
    module._evicted = False  # evictions made before the sync were reset by it
