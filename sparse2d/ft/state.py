"""What a restarted group receives from a live one, rank ``r`` from rank ``r``.

Every embedding shard's weights and fused optimizer state (plus each kernel's step counter),
the dense parameters and buffers, the dense optimizer, and the caller's extras (step, data
position, RNG, counters). The sender clones everything at a safe point: torchft calls
``capture`` from its quorum thread while the sender's main thread either waits in
``start_step`` or, with the quorum overlapped (``sparse2d.ft.quorum``), runs only what a
loop does between ``zero_grad()`` and the model's forward (the pipeline's input all-to-all,
data loading), which changes nothing captured; the forward pre-hook joins the quorum, so no
forward or backward runs during the capture. The clones are what its HTTP transport serves
while the sender trains on.

``fingerprint`` hashes what must match between groups (shard layout, dense shapes, the
caller's config digest): a group joining with another plan or model is refused by name.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import torch
import torch.nn as nn
from torchrec.optim.optimizers import in_backward_optimizer_filter

from sparse2d.errors import ConfigError
from sparse2d.managed_collision import mc_identity_buffers
from sparse2d.sync.shards import ShardState, flush_caches, live_tensors


def _kernels(shards: list[ShardState]) -> list[Any]:
    return list({id(s.kernel): s.kernel for s in shards if s.kernel is not None}.values())


def dense_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Dense parameters (those not updated by a fused kernel) and floating buffers by name."""
    out = {name: p for name, p in in_backward_optimizer_filter(model.named_parameters())}
    for name, b in model.named_buffers():
        if type(b) is torch.Tensor and b.is_floating_point():
            out.setdefault(name, b)
    return out


def fingerprint(model: nn.Module, shards: list[ShardState], digest: str = "") -> int:
    """A 48-bit hash of this rank's shard layout, the dense shapes and ``digest``.

    48 bits: it travels as a float64 in the cross-group all-reduce and must stay exact.
    """
    h = hashlib.sha256(digest.encode())
    for s in shards:
        shapes = [tuple(t.shape) for t in s.optimizer_states]
        h.update(
            f"{s.table}:{s.row_offset}:{s.col_offset}:{tuple(s.weight.shape)}:{shapes};".encode()
        )
    for name, t in sorted(dense_tensors(model).items()):
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype};".encode())
    return int.from_bytes(h.digest()[:6], "big")


def config_mismatch(mine: dict[str, str], theirs: dict[str, str], group: int) -> str:
    """``KEY=mine here, theirs in group G; ...`` for every dotted config key this group and
    group ``group`` disagree on ("" when none: the fingerprints differ elsewhere)."""
    keys = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    return "; ".join(
        f"{k}={mine.get(k, '(unset)')} here, {theirs.get(k, '(unset)')} in group {group}"
        for k in keys
    )


def digest(
    model: nn.Module, shards: list[ShardState], identities: list[torch.Tensor] | None = None
) -> str:
    """SHA-256 of this rank's embedding shards, fused state, dense tensors and managed-collision
    identity tables: equal digests at the same rank of two groups mean bit-identical replicas."""
    flush_caches(shards)
    h = hashlib.sha256()
    for t in identities or []:
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    for t in live_tensors(shards, weights=True, states=True):
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    for _, t in sorted(dense_tensors(model).items()):
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def capture(
    model: nn.Module,
    shards: list[ShardState],
    optimizer: torch.optim.Optimizer,
    extra: dict,
    identities: list[torch.Tensor] | None = None,
) -> dict[str, Any]:
    """A consistent copy of everything a peer needs to continue exactly where this rank is;
    ``identities``: managed-collision identity tables and metadata (raw id -> row)."""
    flush_caches(shards)
    with torch.no_grad():
        return {
            "identities": [t.detach().clone() for t in identities or []],
            "embeddings": [t.clone() for t in live_tensors(shards, weights=True, states=True)],
            "iters": [k.iter.clone() for k in _kernels(shards)],
            "dense": {k: v.detach().clone() for k, v in dense_tensors(model).items()},
            "optimizer": copy.deepcopy(optimizer.state_dict()),
            "extra": copy.deepcopy(extra),
        }


def restore(
    model: nn.Module,
    shards: list[ShardState],
    optimizer: torch.optim.Optimizer,
    state: dict,
    identities: list[torch.Tensor] | None = None,
) -> int:
    """Load ``capture``'s output into the live buffers; return the bytes received."""
    flush_caches(shards)
    targets = live_tensors(shards, weights=True, states=True)
    nbytes = 0
    with torch.no_grad():
        for dst, src in zip(identities or [], state["identities"], strict=True):
            dst.copy_(src)
            nbytes += src.numel() * src.element_size()
        for dst, src in zip(targets, state["embeddings"], strict=True):
            dst.copy_(src)
            nbytes += src.numel() * src.element_size()
        for kernel, it in zip(_kernels(shards), state["iters"], strict=True):
            kernel.iter.copy_(it)
        live = dense_tensors(model)
        for name, src in state["dense"].items():
            live[name].copy_(src)
            nbytes += src.numel() * src.element_size()
    optimizer.load_state_dict(state["optimizer"])
    for value in optimizer.state.values():
        for t in value.values():
            if isinstance(t, torch.Tensor):
                nbytes += t.numel() * t.element_size()
    return nbytes


# ---- a FaultTolerance group's heal (its torchft state-dict hooks) -----------------------
def capture_group(ft: Any) -> dict[str, Any]:
    """``capture`` of a ``FaultTolerance`` group, with what it must hand on: data position,
    skipped slices, its identity (fingerprint, config keys), RNG, MCH iteration counters
    and the caller's extras."""
    extra = {
        "position": ft._position,
        "slices_skipped": ft.slices_skipped,
        "from_group": ft.options.replica_id,
        "fingerprint": ft.fingerprint,
        "config_keys": ft.config_keys,
        "rng": torch.get_rng_state(),
        "user": ft._extra[0]() if ft._extra else {},
        "mc_iters": _mc_iters(ft),
    }
    return capture(ft.model, ft.shards, ft.optimizer, extra, mc_identity_buffers(ft.policy))


def _mc_iters(ft: Any) -> list[int]:
    """The MCH modules' iteration counters (eviction ages; plain ints, not buffers)."""
    mc = ft.policy.mc if hasattr(ft, "policy") else None
    return [int(t.module._current_iter) for t in mc.tables] if mc is not None else []


def check_source(ft: Any, extra: dict[str, Any]) -> None:
    """Refuse a heal from a group with another plan/model/config, naming the config keys."""
    if extra["fingerprint"] == ft.fingerprint:
        return
    mine, source = ft.options.replica_id, extra["from_group"]
    named = config_mismatch(ft.config_keys, extra.get("config_keys") or {}, source)
    if named:
        raise ConfigError(
            f"group {mine} cannot join: group {source} runs another config: {named}; start "
            "every group with the same config"
        )
    raise ConfigError(
        f"group {mine} cannot join: group {source} runs another plan/model/config "
        f"(fingerprint {extra['fingerprint']:x} != {ft.fingerprint:x}); start every group "
        "with the same config and world size"
    )


def restore_group(ft: Any, state: dict[str, Any]) -> int:
    """Load ``capture_group``'s output into a group (its caller sets the data position and
    counters); return the bytes received."""
    extra = state["extra"]
    nbytes = restore(ft.model, ft.shards, ft.optimizer, state, mc_identity_buffers(ft.policy))
    if ft.policy.mc is not None:
        for table, it in zip(ft.policy.mc.tables, extra["mc_iters"], strict=True):
            table.module._current_iter = it
    ft.policy.reset()  # references (scaling) follow the healed values
    torch.set_rng_state(extra["rng"])
    if ft._extra:
        ft._extra[1](extra["user"])
    return nbytes
