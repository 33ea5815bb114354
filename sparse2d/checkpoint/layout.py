"""How embedding shards map to checkpoint keys, and the checks run before any load.

Split from ``checkpoint.py`` (which owns directories, atomicity and the DCP calls):
this module knows the key layout. Shards are wrapped as DTensors over the model's
mesh whose local tensor is TorchRec's ``LocalShardsWrapper`` holding the shards
with their global offsets; DCP writes them as chunks of the global table and on
load reads any overlapping region, which is the resharding.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.tensor import DTensor, Replicate
from torchrec.distributed.shards_wrapper import LocalShardsWrapper

from sparse2d.errors import CheckpointError

ROW, ELEM = "row", "elem"


@dataclass(frozen=True, slots=True)
class TableSpec:
    """A table as the whole model sees it (gathered from every rank's shards)."""

    rows: int
    cols: int
    state_kinds: tuple[str, ...]
    """Per fused optimizer state: ``"row"`` (one value per row) or ``"elem"``."""


def weight_key(table: str) -> str:
    return f"emb.{table}.weight"


def state_key(table: str, index: int, col: int | None = None) -> str:
    return f"emb.{table}.state{index}" + ("" if col is None else f".c{col}")


def table_specs(model: nn.Module) -> dict[str, TableSpec]:
    """Global shape and optimizer-state kinds per table (collective over the world)."""
    local = [
        (
            s.table,
            s.row_offset + s.rows,
            s.col_offset + s.cols,
            tuple(ROW if t.dim() == 1 else ELEM for t in s.optimizer_states),
        )
        for s in model.shard_states
    ]
    gathered: list[list[tuple[str, int, int, tuple[str, ...]]]] = [
        [] for _ in range(dist.get_world_size())
    ]
    dist.all_gather_object(gathered, local)
    rows: dict[str, int] = defaultdict(int)
    cols: dict[str, int] = defaultdict(int)
    kinds: dict[str, tuple[str, ...]] = {}
    for table, row_end, col_end, table_kinds in (x for part in gathered for x in part):
        rows[table] = max(rows[table], row_end)
        cols[table] = max(cols[table], col_end)
        if kinds.setdefault(table, table_kinds) != table_kinds:
            raise CheckpointError(
                f"table {table!r} has shards with different optimizer states ({kinds[table]} "
                f"and {table_kinds}); give every shard of a table the same fused optimizer"
            )
    return {t: TableSpec(rows=rows[t], cols=cols[t], state_kinds=kinds[t]) for t in sorted(rows)}


def _dtensor(
    model: nn.Module, shards: list[torch.Tensor], offsets: list[tuple[int, ...]], shape: tuple
) -> DTensor:
    mesh = model.device_mesh
    stride = torch.empty(shape, device="meta").stride()
    return DTensor.from_local(
        LocalShardsWrapper(shards, offsets),
        device_mesh=mesh,
        placements=[Replicate()] * mesh.ndim,
        run_check=False,
        shape=torch.Size(shape),
        stride=stride,
    )


class Collector:
    """Groups (tensor, global offset) pieces per key, then wraps each key once."""

    def __init__(self) -> None:
        self.pieces: dict[str, list[tuple[torch.Tensor, tuple[int, ...]]]] = defaultdict(list)
        self.shapes: dict[str, tuple[int, ...]] = {}

    def add(self, key: str, tensor: torch.Tensor, offset: tuple[int, ...], shape: tuple) -> None:
        self.pieces[key].append((tensor, offset))
        self.shapes[key] = shape

    def build(self, model: nn.Module) -> dict[str, DTensor]:
        return {
            key: _dtensor(model, [t for t, _ in p], [o for _, o in p], self.shapes[key])
            for key, p in self.pieces.items()
        }


def build_embedding_state(
    model: nn.Module, specs: dict[str, TableSpec], shards: list | None = None
) -> dict[str, DTensor]:
    """This rank's shards (default: all of them; weights and optimizer states) as
    DTensors of the global tables."""
    out = Collector()
    for s in model.shard_states if shards is None else shards:
        spec = specs[s.table]
        full = (spec.rows, spec.cols)
        out.add(weight_key(s.table), s.weight.detach(), (s.row_offset, s.col_offset), full)
        for i, t in enumerate(s.optimizer_states):
            if t.dim() == 1:
                out.add(state_key(s.table, i, s.col_offset), t.detach(), (s.row_offset,), full[:1])
            else:
                out.add(state_key(s.table, i), t.detach(), (s.row_offset, s.col_offset), full)
    return out.build(model)


def row_blocks(metadata: Metadata, table: str, index: int, cols: int) -> list[tuple[int, int]]:
    """``(col_offset, width)`` of the saved row-wise state blocks of one table state."""
    prefix = state_key(table, index) + ".c"
    starts = sorted(
        int(k[len(prefix) :])
        for k in metadata.state_dict_metadata
        if k.startswith(prefix) and k[len(prefix) :].isdigit()
    )
    if not starts:
        return []
    ends = [*starts[1:], cols]
    return [(a, b - a) for a, b in zip(starts, ends, strict=True)]


def build_load_state(
    model: nn.Module, specs: dict[str, TableSpec], metadata: Metadata, shards: list | None = None
) -> tuple[dict[str, DTensor], Callable[[], None]]:
    """Scratch buffers for this rank's new shards (default: all of them), and ``commit()``
    copying them in place.

    A row-wise state of a new shard spanning several saved column blocks gets their
    width-weighted mean (exact for row-wise Adagrad, whose accumulator is a mean
    over the block's columns); a shard inside one saved block copies it exactly.
    """
    out = Collector()
    copies: list[tuple[torch.Tensor, Callable[[], torch.Tensor]]] = []
    shared: dict[tuple[str, int, int], torch.Tensor] = {}
    for s in model.shard_states if shards is None else shards:
        spec = specs[s.table]
        full = (spec.rows, spec.cols)
        buffer = torch.empty_like(s.weight)
        out.add(weight_key(s.table), buffer, (s.row_offset, s.col_offset), full)
        copies.append((s.weight, lambda b=buffer: b))
        for i, live in enumerate(s.optimizer_states):
            if live.dim() == 2:
                buffer = torch.empty_like(live)
                out.add(state_key(s.table, i), buffer, (s.row_offset, s.col_offset), full)
                copies.append((live, lambda b=buffer: b))
                continue
            parts: list[tuple[torch.Tensor, int]] = []
            for start, width in row_blocks(metadata, s.table, i, spec.cols):
                overlap = min(start + width, s.col_offset + s.cols) - max(start, s.col_offset)
                if overlap <= 0:
                    continue
                cache = (state_key(s.table, i, start), s.row_offset, s.rows)
                if cache not in shared:
                    shared[cache] = torch.empty_like(live)
                    out.add(cache[0], shared[cache], (s.row_offset,), full[:1])
                parts.append((shared[cache], overlap))
            copies.append((live, lambda p=parts, n=s.cols: _blend(p, n)))

    def commit() -> None:
        for live, value in copies:
            live.copy_(value())

    return out.build(model), commit


def _blend(parts: list[tuple[torch.Tensor, int]], cols: int) -> torch.Tensor:
    if len(parts) == 1:
        return parts[0][0]
    total = sum(buffer.double() * width for buffer, width in parts)
    return (total / cols).to(parts[0][0].dtype)


MC_MODULES = "._managed_collision_modules."


def dense_entries(model: nn.Module) -> dict[str, torch.Tensor]:
    """Plain (replicated) tensors of ``model.state_dict()``: dense params and buffers.

    Managed-collision modules' plain buffers (iteration counter, shard segments) are per
    shard, not replicated: ``checkpoint.mc_identities`` carries what of them is state."""
    return {
        name: value
        for name, value in model.state_dict().items()
        if (type(value) is torch.Tensor or type(value) is nn.Parameter)
        and MC_MODULES not in f".{name}"
    }


# ---- checks before any load (pure, identical on every rank) ------------------------
_KEY = re.compile(r"^emb\.(.+)\.(weight|state\d+)(\.c\d+)?$")


def _table_of(fqn: str) -> str:
    match = _KEY.match(fqn)
    return f"table {match.group(1)!r}" if match else f"entry {fqn!r}"


def check_files(ckpt: str, metadata: Metadata, error: type[Exception]) -> None:
    """Every stored chunk lies within its file: catches truncated or missing files.

    The message names every table (then other entries) with bytes past the end.
    """
    sizes: dict[str, int] = {}
    damaged: dict[str, list[str]] = {}
    for index, info in (metadata.storage_data or {}).items():
        name = os.path.join(ckpt, info.relative_path)
        if name not in sizes:
            sizes[name] = os.path.getsize(name) if os.path.isfile(name) else -1
        if sizes[name] < info.offset + info.length:
            damaged.setdefault(info.relative_path, []).append(_table_of(index.fqn))
    if damaged:
        parts = []
        for file, what in sorted(damaged.items()):
            size = sizes[os.path.join(ckpt, file)]
            have = "missing" if size < 0 else f"{size} bytes"
            names = sorted(set(what), key=lambda w: (not w.startswith("table"), w))
            parts.append(f"{file} ({have}) lacks data of {', '.join(names)}")
        raise error(
            f"checkpoint {ckpt!r} is truncated or corrupt: {'; '.join(parts)}; "
            f"use an older checkpoint"
        )


def _expect(
    ckpt: str, metadata: Metadata, key: str, shape: tuple, what: str, error: type[Exception]
) -> None:
    found = metadata.state_dict_metadata.get(key)
    if found is None:
        raise error(f"checkpoint {ckpt!r} has no {what} ({key}); it was saved from another model")
    if not isinstance(found, TensorStorageMetadata) or tuple(found.size) != tuple(shape):
        size = tuple(found.size) if isinstance(found, TensorStorageMetadata) else "bytes"
        raise error(f"checkpoint {ckpt!r}: {what} has shape {size}, the model expects {shape}")


def check_tables(
    ckpt: str,
    metadata: Metadata,
    specs: dict[str, TableSpec],
    dense: dict[str, torch.Tensor],
    error: type[Exception],
) -> None:
    """Every table, optimizer state and dense tensor exists with the model's shape."""
    keys = metadata.state_dict_metadata
    saved_tables = {m.group(1) for m in map(_KEY.match, keys) if m and m.group(2) == "weight"}
    for table in sorted(saved_tables - set(specs)):
        raise error(f"checkpoint {ckpt!r} has table {table!r}, which the model lacks")
    for table, spec in specs.items():
        what = f"table {table!r}"
        _expect(ckpt, metadata, weight_key(table), (spec.rows, spec.cols), what, error)
        saved = []
        while True:
            i = len(saved)
            if state_key(table, i) in keys:
                saved.append(ELEM)
            elif row_blocks(metadata, table, i, spec.cols):
                saved.append(ROW)
            else:
                break
        if tuple(saved) != spec.state_kinds:
            raise error(
                f"checkpoint {ckpt!r}: table {table!r} was saved with fused optimizer states "
                f"{saved}, the model has {list(spec.state_kinds)}; use the same optimizer"
            )
        for i, kind in enumerate(spec.state_kinds):
            if kind == ELEM:
                _expect(ckpt, metadata, state_key(table, i), (spec.rows, spec.cols), what, error)
                continue
            blocks = row_blocks(metadata, table, i, spec.cols)
            if blocks[0][0] != 0 or any(w <= 0 for _, w in blocks):
                raise error(f"checkpoint {ckpt!r}: table {table!r} has bad column blocks {blocks}")
            for start, _ in blocks:
                _expect(ckpt, metadata, state_key(table, i, start), (spec.rows,), what, error)
    for name, tensor in dense.items():
        _expect(ckpt, metadata, f"dense.{name}", tuple(tensor.shape), f"dense {name!r}", error)
