"""Identity tables of managed-collision (MC) tables in checkpoints.

An MC table's rows mean nothing without its identity table (raw id -> row), so a checkpoint
carries each shard's identity state as global tensors laid out like TorchRec's own state
dict (the ``mc.T.*`` keys: docs/checkpoints.md). MCH ids seen since the last eviction round
are not saved (nor by TorchRec): with ``eviction_interval > 1`` save at a multiple of it.
``check_identities`` compares ``COMPLETE.json`` with the model on every rank before any
collective. An MCH table loaded at another ``L`` is rebuilt by id: each new shard takes the
saved ids TorchRec routes to it (the best ``rows - 1`` by the eviction score if they do not
fit) with their rows and optimizer state; MP-ZCH buckets do not depend on ``L``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torchrec.distributed.mc_modules import ShardedManagedCollisionCollection
from torchrec.modules.hash_mc_modules import HashZchManagedCollisionModule
from torchrec.modules.mc_modules import MCHManagedCollisionModule

from sparse2d.checkpoint.directory import MARKER
from sparse2d.checkpoint.layout import ELEM, Collector, TableSpec, row_blocks, state_key, weight_key
from sparse2d.managed_collision.merge import INT64_MAX, score
from sparse2d.managed_collision.tables import find_mc_tables, policy_name
from sparse2d.managed_collision.zch_sync import find_zch_tables
from sparse2d.sync.shards import ShardState

MCH, ZCH = "mch", "zch"
KINDS = {MCH: "MCHManagedCollisionModule", ZCH: "HashZchManagedCollisionModule"}


def ids_key(table: str) -> str:
    return f"mc.{table}.ids"


def _segments(module: nn.Module) -> list[int]:
    """Row segments of the table's shards (MCH) or buckets (MP-ZCH), ``[0, ..., Z]``."""
    if isinstance(module, HashZchManagedCollisionModule):
        return [int(x) for x in module._output_segments]
    out: list[int] = []
    for value in module._output_segments_tensor.tolist():
        if value < 0 or (out and value <= out[-1]):
            break
        out.append(int(value))
    return out


def describe(model: nn.Module) -> dict[str, dict[str, Any]]:
    """``{table: description}`` of the sharded MC tables this rank holds (pure)."""
    out: dict[str, dict[str, Any]] = {}
    for sub in model.modules():
        if not isinstance(sub, ShardedManagedCollisionCollection):
            continue
        for name, mc in sub._managed_collision_modules.items():
            segments = _segments(mc)
            info: dict[str, Any] = {
                "zch_size": segments[-1],
                "input_hash_size": int(mc._input_hash_size),
                "segments": segments,
            }
            if isinstance(mc, HashZchManagedCollisionModule):
                info.update(kind=ZCH, buckets=int(mc._buckets))
                info["metadata"] = mc._hash_zch_metadata is not None
            else:
                info.update(kind=MCH, policy=policy_name(mc)[0])
            out[name] = info
    return out


# ---- checks before any load (pure, identical on every rank) ------------------------
def _mismatch(ckpt: str, table: str, key: str, saved: Any, model: Any, fix: str) -> str:
    return (
        f"checkpoint {ckpt!r} ({MARKER} managed_collision.{table}, key {key}): the "
        f"identity table of managed-collision table {table!r} was saved with {saved}, the "
        f"model has {model}; {fix}"
    )


def check_identities(
    ckpt: str,
    saved: dict[str, dict[str, Any]],
    metadata: Metadata,
    model: dict[str, dict[str, Any]],
    error: type[Exception],
) -> None:
    """The checkpoint's MC tables are the model's: names, kind, sizes, policy, keys, shapes."""
    same = "load it into a model with the same managed-collision configuration"
    for table in sorted(set(saved) | set(model)):
        key = ids_key(table)
        if table not in model:
            raise error(
                f"checkpoint {ckpt!r} ({MARKER} managed_collision.{table}, key {key}) holds the "
                f"identity table of managed-collision table {table!r}, which the model lacks "
                f"(its managed-collision tables: {sorted(model)}); {same}"
            )
        if table not in saved:
            raise error(
                f"checkpoint {ckpt!r} ({MARKER} managed_collision) has no identity table for "
                f"managed-collision table {table!r} (key {key} missing): its rows alone would "
                f"be looked up by the wrong ids; {same}"
            )
        have, want = saved[table], model[table]
        if have["kind"] != want["kind"]:
            s, m = KINDS[have["kind"]], KINDS[want["kind"]]
            raise error(_mismatch(ckpt, table, key, s, m, same))
        fields = ["zch_size", "input_hash_size"]
        fields += ["buckets", "metadata"] if want["kind"] == ZCH else ["policy"]
        for name in fields:
            if have.get(name) != want[name]:
                saw, mod = f"{name}={have.get(name)!r}", f"{name}={want[name]!r}"
                raise error(_mismatch(ckpt, table, key, saw, mod, same))
        shape = (want["zch_size"],) + ((1,) if want["kind"] == ZCH else ())
        found = metadata.state_dict_metadata.get(key)
        if not isinstance(found, TensorStorageMetadata) or tuple(found.size) != shape:
            size = tuple(found.size) if isinstance(found, TensorStorageMetadata) else None
            raise error(
                f"checkpoint {ckpt!r}: key {key} has shape {size}, the model's managed-"
                f"collision table {table!r} expects {shape}; the checkpoint is damaged"
            )


# ---- save --------------------------------------------------------------------------
def _iters(module: MCHManagedCollisionModule) -> torch.Tensor:
    current = int(module._current_iter_tensor.item())
    last = module._last_eviction_iter if module._current_iter != -1 else current
    return torch.tensor([[current, last, module._input_history_buffer_size]], dtype=torch.int64)


def save_entries(model: nn.Module, shards: list[ShardState]) -> dict[str, Any]:
    """The identity state of the MC tables among ``shards``, as DTensors of global tensors."""
    out = Collector()
    for table in find_mc_tables(model, shards):
        mc, offset = table.module, table.offset
        segments = _segments(mc)
        total = (segments[-1],)
        out.add(ids_key(table.name), mc._mch_sorted_raw_ids.detach(), (offset,), total)
        out.add(f"mc.{table.name}.rows", mc._mch_remapped_ids_mapping.detach(), (offset,), total)
        for name in sorted(mc._mch_metadata):
            buffer = getattr(mc, f"_mch_{name}").detach()
            out.add(f"mc.{table.name}.meta.{name}", buffer, (offset,), total)
        shape = (len(segments) - 1, 3)
        out.add(f"mc.{table.name}.iter", _iters(mc), (segments.index(offset), 0), shape)
    for table in find_zch_tables(model, shards):
        mc = table.module
        offset, total = table.shards[0].row_offset, (int(mc._output_segments[-1]), 1)
        out.add(ids_key(table.name), mc._hash_zch_identities.detach(), (offset, 0), total)
        if mc._hash_zch_metadata is not None:
            out.add(f"mc.{table.name}.meta", mc._hash_zch_metadata.detach(), (offset, 0), total)
    return out.build(model)


# ---- load --------------------------------------------------------------------------
def owners(ids: torch.Tensor, input_hash_size: int, buckets: int, shards: int) -> torch.Tensor:
    """The shard TorchRec's block bucketization sends each raw id to."""
    block = math.ceil(input_hash_size / buckets)
    inside = ids < block * buckets
    return torch.where(inside, (ids // block) // (buckets // shards), ids % shards)


class _McLoad:
    """Scratch reads of the MC tables' identity state and ``commit`` writing them in place."""

    def __init__(self, specs: dict[str, TableSpec], metadata: Metadata) -> None:
        self.specs, self.metadata = specs, metadata
        self.out = Collector()
        self.commits: list[Callable[[], None]] = []
        self.rebuilt: set[int] = set()
        """``id()`` of the shards whose rows are rebuilt by id (not read by position)."""

    def _read(self, key: str, like: torch.Tensor, offset: tuple, shape: tuple) -> torch.Tensor:
        buffer = torch.empty_like(like)
        self.out.add(key, buffer, offset, shape)
        return buffer

    def zch(self, table: Any) -> None:
        mc = table.module
        offset, total = table.shards[0].row_offset, (int(mc._output_segments[-1]), 1)
        ids = self._read(ids_key(table.name), mc._hash_zch_identities, (offset, 0), total)
        meta = mc._hash_zch_metadata
        saved = (
            None if meta is None else self._read(f"mc.{table.name}.meta", meta, (offset, 0), total)
        )

        def commit() -> None:
            mc._hash_zch_identities.data.copy_(ids)
            if meta is not None and saved is not None:
                meta.copy_(saved)

        self.commits.append(commit)

    def mch(self, table: Any, saved_segments: list[int]) -> None:
        mc, name = table.module, table.name
        segments = _segments(mc)
        parents = self._parents(mc, segments, saved_segments, table.offset)
        lo, hi = saved_segments[parents[0]], saved_segments[parents[-1] + 1]
        total = (segments[-1],)
        span = torch.empty(hi - lo, dtype=torch.int64)
        ids = self._read(ids_key(name), span, (lo,), total)
        rows = self._read(f"mc.{name}.rows", span, (lo,), total)
        meta = {k: self._read(f"mc.{name}.meta.{k}", span, (lo,), total) for k in mc._mch_metadata}
        iters = self._read(
            f"mc.{name}.iter",
            torch.empty(len(saved_segments) - 1, 3, dtype=torch.int64),
            (0, 0),
            (len(saved_segments) - 1, 3),
        )
        if saved_segments == segments:  # the same shards: every buffer by position
            index = segments.index(table.offset)
            self.commits.append(lambda: _adopt(mc, ids, rows, meta, iters[index]))
            return
        shard_rows = [self._span(s, lo, hi) for s in table.shards]
        for shard in table.shards:
            self.rebuilt.add(id(shard))
        sentinels = [saved_segments[j + 1] - 1 - lo for j in parents]

        def commit() -> None:
            keep = _survivors(mc, segments, table.offset, ids, meta, iters)
            size, offset = table.size, table.offset
            count = keep.numel()
            new_ids = torch.full((size,), INT64_MAX, dtype=torch.int64)
            new_ids[:count] = ids[keep]
            new_meta = {k: torch.zeros(size, dtype=torch.int64) for k in meta}
            for k, values in meta.items():
                new_meta[k][:count] = values[keep]
            new_rows = torch.arange(offset, offset + size, dtype=torch.int64)
            counters = iters.max(0).values.clone()
            counters[2] = -1  # other shards see other batches: sized anew by the first one
            _adopt(mc, new_ids, new_rows, new_meta, counters)
            source = rows[keep] - lo
            for shard, scratch in zip(table.shards, shard_rows, strict=True):
                for live, saved in zip(
                    [shard.weight, *shard.optimizer_states], scratch, strict=True
                ):
                    value = torch.zeros_like(live)
                    value[:count] = saved[source]
                    value[size - 1] = saved[sentinels].double().mean(0).to(live.dtype)
                    live.copy_(value)

        self.commits.append(commit)

    def _parents(
        self, mc: nn.Module, segments: list[int], saved: list[int], offset: int
    ) -> list[int]:
        """Saved shards whose raw id range meets this shard's (MCH)."""
        hash_size = int(mc._input_hash_size)
        mine, theirs = len(segments) - 1, len(saved) - 1
        k = segments.index(offset)
        new_block, old_block = math.ceil(hash_size / mine), math.ceil(hash_size / theirs)
        start, end = k * new_block, min((k + 1) * new_block, hash_size)
        return [j for j in range(theirs) if j * old_block < end and (j + 1) * old_block > start]

    def _span(self, shard: ShardState, lo: int, hi: int) -> list[torch.Tensor]:
        """Scratch for saved rows ``[lo, hi)`` of the shard's weight and every state."""
        spec = self.specs[shard.table]
        full = (spec.rows, spec.cols)
        weight = torch.empty(hi - lo, shard.cols, dtype=shard.weight.dtype)
        out = [weight]
        self.out.add(weight_key(shard.table), weight, (lo, shard.col_offset), full)
        for i, live in enumerate(shard.optimizer_states):
            if spec.state_kinds[i] == ELEM:
                buffer = torch.empty(hi - lo, shard.cols, dtype=live.dtype)
                self.out.add(state_key(shard.table, i), buffer, (lo, shard.col_offset), full)
            else:
                blocks = row_blocks(self.metadata, shard.table, i, spec.cols)
                buffer = torch.empty(hi - lo, dtype=live.dtype)
                self.out.add(state_key(shard.table, i, blocks[0][0]), buffer, (lo,), full[:1])
            out.append(buffer)
        return out


def _adopt(
    mc: nn.Module,
    ids: torch.Tensor,
    rows: torch.Tensor,
    meta: dict[str, torch.Tensor],
    iters: torch.Tensor,
) -> None:
    """Write an identity table and the iteration counters into a live MCH module."""
    mc._mch_sorted_raw_ids.copy_(ids[: mc._zch_size])
    mc._mch_remapped_ids_mapping.copy_(rows[: mc._zch_size])
    for key, value in meta.items():
        getattr(mc, f"_mch_{key}").copy_(value[: mc._zch_size])
    current, last, history = (int(x) for x in iters[:3])
    mc._current_iter, mc._last_eviction_iter = current, last
    mc._current_iter_tensor.fill_(current)
    _size_history(mc, history)
    mc._evicted = False


def _size_history(mc: nn.Module, size: int) -> None:
    """Empty history buffers of ``size`` ids, as ``MCHManagedCollisionModule.
    _init_history_buffers`` makes them at the first batch (-1: left to the first batch)."""
    mc._current_history_buffer_offset = 0
    if size < 0 or size == mc._input_history_buffer_size:
        return
    mc._input_history_buffer_size = size
    mc._history_accumulator = torch.empty(size, dtype=torch.int64, device=mc.device)
    for name, _, is_history in mc._eviction_policy.metadata_info:
        if is_history:
            buffer = torch.zeros(size, dtype=torch.int64, device=mc.device)
            mc.register_buffer(f"_history_{name}", buffer, persistent=False)
            mc._history_metadata[name] = getattr(mc, f"_history_{name}")


def _survivors(
    mc: nn.Module,
    segments: list[int],
    offset: int,
    ids: torch.Tensor,
    meta: dict[str, torch.Tensor],
    iters: torch.Tensor,
) -> torch.Tensor:
    """Positions (into the saved span) of the ids this shard keeps, ascending by id."""
    valid = ids != INT64_MAX
    mine = owners(ids, int(mc._input_hash_size), int(mc.buckets()), len(segments) - 1)
    cand = torch.nonzero(valid & (mine == segments.index(offset))).flatten()
    cand = cand[torch.argsort(ids[cand], stable=True)]
    room = int(mc._zch_size) - 1
    if cand.numel() > room:
        policy, decay = policy_name(mc)
        values = score(policy, {k: v[cand] for k, v in meta.items()}, int(iters[:, 0].max()), decay)
        best = torch.argsort(values, descending=True, stable=True)[:room]
        cand = cand[torch.sort(best).values]
    return cand


def load_entries(
    model: nn.Module,
    shards: list[ShardState],
    saved: dict[str, dict[str, Any]],
    specs: dict[str, TableSpec],
    metadata: Metadata,
) -> tuple[dict[str, Any], Callable[[], None], set[int]]:
    """Scratch reads for the MC tables among ``shards``, the commit writing them, and the
    ``id()`` of shards whose rows the commit rebuilds by id (read nothing else for them)."""
    plan = _McLoad(specs, metadata)
    for table in find_zch_tables(model, shards):
        plan.zch(table)
    for table in find_mc_tables(model, shards):
        plan.mch(table, saved[table.name]["segments"])

    def commit() -> None:
        for step in plan.commits:
            step()

    return plan.out.build(model), commit, plan.rebuilt
