"""Checkpoints of a ``DMPCollection`` over ``torch.distributed.checkpoint`` (DCP).

Layout under a root ``path``::

    path/step_00000010/        complete checkpoint (DCP files + COMPLETE.json)
    path/step_00000015.tmp-ab/ a save in progress or one killed midway (never read)
    path/latest                name of the newest complete checkpoint (moved atomically)

Why our own state dict instead of ``model.state_dict()``: each local shard
(``model.shard_states``) is written with its global table offsets, so any
(world size, group size, plan) can load it, DCP doing the resharding; only
replica-rank 0 of each replica group contributes embedding shards (dedup); and
loads land in scratch buffers first, so a bad checkpoint never half-overwrites a
live model. Keys: ``emb.T.weight`` ``(rows, dim)``, ``emb.T.stateI`` for an
element-wise optimizer state ``(rows, dim)``, ``emb.T.stateI.cC`` for a row-wise
state ``(rows,)`` of the column block starting at ``C`` (column-wise shards keep
one accumulator each), ``dense.NAME`` for every plain tensor of
``model.state_dict()``, ``mc.T.*`` for managed-collision identity tables
(``checkpoint.mc_identities``), and pickled blobs ``extra``, ``dense_optimizer``, ``rng.rankR``.
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import time
import uuid
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata

from sparse2d.checkpoint.directory import (
    MARKER,
    PREFIX,
    latest,
    publish,
    resolve_checkpoint,
    save_target,
)
from sparse2d.checkpoint.integrity import MARKER_KEY, agree_on_failure, digest_files, verify_files
from sparse2d.checkpoint.layout import (
    build_embedding_state,
    build_load_state,
    check_files,
    check_tables,
    dense_entries,
    table_specs,
)
from sparse2d.checkpoint.mc_identities import check_identities, describe, load_entries, save_entries
from sparse2d.core.fully_sharded import materialized
from sparse2d.errors import CheckpointError, CorruptCheckpointError
from sparse2d.sync.ballot import Ballot, Flag
from sparse2d.sync.shards import flush_caches

FORMAT_VERSION = 1
READ_FAILED = Flag("read_failed")
"""DCP's read failed on this rank; any rank: every rank raises before a live value changes."""
READ = Ballot(READ_FAILED)


def _one_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".replace("\n", " ")[:300]


# ---- blobs -------------------------------------------------------------------------
def _blob(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _unblob(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=False)


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:
        pass
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])


def _fused_iter(model: nn.Module) -> int:
    """The fused kernels' step counter (Adam-style bias correction); max over local kernels."""
    kernels = {id(s.kernel): s.kernel for s in model.shard_states if s.kernel is not None}
    return max((int(k.iter[0]) for k in kernels.values()), default=0)


# ---- save --------------------------------------------------------------------------
def _shards_by_replica_index(model: nn.Module, rank: int) -> list[tuple[int, list]]:
    """This rank's shards grouped by its position in their replica group.

    One group per sharding context (per-module group sizes give a rank a different
    replica position per context); a model without contexts is one group.
    """
    contexts = getattr(model, "contexts", None)
    if not contexts:
        return [(model.replica_group.index(rank), list(model.shard_states))]
    return [(c.replica_group.index(rank), list(c.shards)) for c in contexts if c.shards]


def build_save_state(
    model: nn.Module,
    dense_optimizer: torch.optim.Optimizer | None = None,
    extra: dict[str, Any] | None = None,
    *,
    dedup: bool = True,
) -> dict[str, Any]:
    """The DCP state dict ``save`` writes (collective: gathers table specs).

    ``dedup=False`` makes every replica write its own copy under ``replicaK.`` keys:
    the naive baseline the benchmark measures; such a checkpoint is not loadable.
    """
    specs = table_specs(model)
    rank = dist.get_rank()
    state: dict[str, Any] = {}
    flush_caches(model.shard_states)
    for replica_index, shards in _shards_by_replica_index(model, rank):
        if dedup and replica_index != 0:
            continue
        prefix = "" if dedup else f"replica{replica_index}."
        for key, value in build_embedding_state(model, specs, shards).items():
            state[prefix + key] = value
        for key, value in save_entries(model, shards).items():  # MC identity tables
            state[prefix + key] = value
    for name, tensor in dense_entries(model).items():
        state[f"dense.{name}"] = tensor
    state["extra"] = _blob(dict(extra or {}))
    if dense_optimizer is not None:
        state["dense_optimizer"] = _blob(dense_optimizer.state_dict())
    state[f"rng.rank{rank}"] = _blob(_rng_state())
    return state


def save(
    path: str | os.PathLike[str],
    model: nn.Module,
    dense_optimizer: torch.optim.Optimizer | None = None,
    extra: dict[str, Any] | None = None,
    *,
    step: int | None = None,
    keep: int | None = None,
) -> str:
    """Write a complete checkpoint under ``path`` and move ``path/latest`` to it (collective).

    ``path`` is a root; ``root/step_N`` is accepted too (saves step ``N`` under root).
    The step directory is named by ``step``, else ``extra["step"]``, else latest + 1.
    Data land in ``step_N.tmp-ID/``; only after every rank finished and rank 0 wrote the
    completion marker is it renamed to ``step_N/`` and ``latest`` replaced, so a save
    killed midway leaves the previous checkpoint intact. ``keep=K`` then deletes all
    but the newest ``K``. ``extra`` (step counter, data position, ...) must be the same
    on every rank (one copy is written); RNG states are saved per rank. Under local
    SGD (``sync_every > 1``) save right after a sync: replica-rank 0's copy is written.
    Returns the checkpoint directory.
    """
    root = os.fspath(path)
    finish = getattr(model, "finish_sync", None)
    if finish is not None:  # land any hidden/delayed transfer before reading the shards
        finish()
    if any(p.stream is not None for p in getattr(model, "sync_policies", [])):
        model.sync()  # a stream never leaves every row averaged at once: write the average
    root, step = save_target(root, step, extra, keep)
    rank = dist.get_rank()
    token = [uuid.uuid4().hex[:8] if rank == 0 else None]
    dist.broadcast_object_list(token, src=0)
    name = f"{PREFIX}{step:08d}"
    tmp = os.path.join(root, f"{name}.tmp-{token[0]}")
    start = time.perf_counter()
    marker = _write(tmp, root, step, model, dense_optimizer, extra)
    marker["save_seconds"] = time.perf_counter() - start
    outcome: list[Any] = [None]
    if rank == 0:
        try:
            publish(tmp, root, name, token[0], marker, keep)
        except OSError as error:
            outcome[0] = f"{type(error).__name__}: {error}"
    dist.broadcast_object_list(outcome, src=0)
    if outcome[0] is not None:
        raise CheckpointError(f"finalizing checkpoint {tmp!r} failed on rank 0: {outcome[0]}")
    return os.path.join(root, name)


def _write(
    tmp: str,
    root: str,
    step: int,
    model: nn.Module,
    dense_optimizer: torch.optim.Optimizer | None,
    extra: dict[str, Any] | None,
) -> dict[str, Any]:
    """Every rank writes its part under ``tmp`` (collective); a failure on any rank removes
    ``tmp`` and raises on every rank. Returns the completion marker (without the timing)."""
    rank = dist.get_rank()
    with materialized(model):  # FULLY_SHARDED: the full buffers while DCP reads them
        state = build_save_state(model, dense_optimizer, extra)
        specs = table_specs(model)
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, (_fused_iter(model), describe(model)))
        failure: dict[int, str] = {}
        try:
            dcp.save(state, storage_writer=FileSystemWriter(tmp, sync_files=True))
        except CheckpointException as error:  # DCP gathered every rank's write error
            failure = {r: _one_line(pair[0]) for r, pair in error.failures.items()}
        except Exception as error:  # disk full, quota, permissions: every rank must hear of it
            failure = {rank: _one_line(error)}
    failed = agree_on_failure(failure)
    if failed:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(
            f"saving checkpoint step {step} under {root!r} failed on rank(s) "
            f"{sorted(failed)} ({next(iter(failed.values()))}); the previous checkpoint "
            f"{latest(root)!r} is untouched and loadable. Free disk space (or raise the "
            "file-size/quota limit) and save again."
        )
    return {
        "format": FORMAT_VERSION,
        "step": step,
        "world_size": dist.get_world_size(),
        "sharding_group_size": model.sharding_group_size,
        "num_replicas": model.num_replicas,
        "fused_iter": max(fused for fused, _ in gathered),
        "tables": {t: [s.rows, s.cols] for t, s in specs.items()},
        "managed_collision": {t: info for _, part in gathered for t, info in part.items()},
        "save_seconds": 0.0,
        MARKER_KEY: digest_files(tmp),
    }


# ---- load --------------------------------------------------------------------------
def _read_metadata(ckpt: str) -> Metadata:
    try:
        return FileSystemReader(ckpt).read_metadata()
    except Exception as error:  # any failure to parse means an unusable checkpoint
        raise CorruptCheckpointError(
            f"checkpoint {ckpt!r}: cannot read DCP metadata ({type(error).__name__}: {error}); "
            f"the checkpoint is corrupt, pick an older one"
        ) from error


def _read_marker(ckpt: str) -> dict[str, Any]:
    try:
        with open(os.path.join(ckpt, MARKER)) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as error:
        raise CheckpointError(f"checkpoint {ckpt!r}: unreadable {MARKER}: {error}") from error


def load(
    path: str | os.PathLike[str],
    model: nn.Module,
    dense_optimizer: torch.optim.Optimizer | None = None,
    *,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Load a checkpoint into ``model`` (any world/group size and plan) and return ``extra``.

    ``path`` is a checkpoint directory or a root (its latest complete checkpoint is used).
    Every check (completeness, truncated files, per-file sha256 checksums, missing
    tables, shapes, optimizer states) runs on every rank before anything is modified; reads go to scratch
    buffers and are copied into the live shards only after every rank read everything.
    RNG states are restored when the world size is unchanged (they are per rank).
    """
    ckpt = resolve_checkpoint(os.fspath(path))
    marker, metadata = _checked(ckpt, model)
    specs = table_specs(model)  # collective, reached unconditionally by every rank
    dense = dense_entries(model)
    check_tables(ckpt, metadata, specs, dense, CheckpointError)
    keys = metadata.state_dict_metadata
    if dense_optimizer is not None and "dense_optimizer" not in keys:
        raise CheckpointError(
            f"checkpoint {ckpt!r} has no dense optimizer state; load without dense_optimizer"
        )
    mc_state, mc_commit, rebuilt = load_entries(
        model, model.shard_states, saved_mc(marker), specs, metadata
    )
    positional = [s for s in model.shard_states if id(s) not in rebuilt]
    state, commit = build_load_state(model, specs, metadata, positional)
    state.update(mc_state)
    scratch_dense = {name: torch.empty_like(t) for name, t in dense.items()}
    state.update({f"dense.{name}": t for name, t in scratch_dense.items()})
    state["extra"] = b""
    if dense_optimizer is not None:
        state["dense_optimizer"] = b""
    rng_key = f"rng.rank{dist.get_rank()}"
    use_rng = restore_rng and marker.get("world_size") == dist.get_world_size()
    if use_rng and rng_key in keys:
        state[rng_key] = b""
    _read(ckpt, state)
    with materialized(model), torch.no_grad():  # identical values land on every replica
        commit()
        mc_commit()  # identity tables, and the rows of MC tables rebuilt by id
        for name, tensor in dense.items():
            tensor.copy_(scratch_dense[name])
        iteration = int(marker.get("fused_iter", 0))
        for kernel in {id(s.kernel): s.kernel for s in model.shard_states}.values():
            if kernel is not None:
                kernel.iter.fill_(iteration)
    for policy in getattr(model, "sync_policies", []):  # AdaGrad references: of old values
        policy.reset()
    if dense_optimizer is not None:
        dense_optimizer.load_state_dict(_unblob(state["dense_optimizer"]))
    if rng_key in state:
        _set_rng_state(_unblob(state[rng_key]))
    return _unblob(state["extra"])


def saved_mc(marker: dict[str, Any]) -> dict[str, Any]:
    """The managed-collision description a checkpoint's marker recorded (``{}``: none)."""
    return marker.get("managed_collision", {})


def _checked(ckpt: str, model: nn.Module) -> tuple[dict[str, Any], Metadata]:
    """The marker and DCP metadata of ``ckpt`` once it proved complete and intact and its
    identity tables match the model's MC configuration; raises on every rank otherwise."""
    marker = _read_marker(ckpt)
    try:  # truncation first: its message names the tables that lost data
        metadata = _read_metadata(ckpt)
        check_files(ckpt, metadata, CorruptCheckpointError)
    except CorruptCheckpointError as damaged:
        try:  # add which file failed its checksum, when one did
            verify_files(ckpt, marker, CorruptCheckpointError)
        except CorruptCheckpointError as corrupt:
            raise CorruptCheckpointError(f"{damaged} [{corrupt}]") from None
        raise
    # checked before the first collective
    check_identities(ckpt, saved_mc(marker), metadata, describe(model), CheckpointError)
    verify_files(ckpt, marker, CorruptCheckpointError)  # flipped bytes DCP would load silently
    return marker, metadata


def _read(ckpt: str, state: dict[str, Any]) -> None:
    """DCP reads ``state``'s scratch buffers (collective); any rank's failure raises on every
    rank before a live value is touched."""
    failure = ""
    try:
        dcp.load(state, storage_reader=FileSystemReader(ckpt))
    except CheckpointException as error:  # DCP gathers read errors from every rank
        failure = "; ".join(f"rank {r}: {_one_line(p[0])}" for r, p in error.failures.items())
    except Exception as error:
        failure = _one_line(error)
    if READ.start({READ_FAILED.name: bool(failure)}, None).wait()[READ_FAILED]:
        raise CheckpointError(
            f"checkpoint {ckpt!r}: reading failed, the model was not modified: "
            f"{failure or 'another rank failed'}"
        )
