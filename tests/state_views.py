"""What a rank holds through the public surfaces: state-dict tensors and TBE storage bytes."""

from __future__ import annotations

import torch
from torch import nn


def local_tensors(value: object) -> list[torch.Tensor]:
    """The tensors this rank holds for one state-dict entry (DTensor, ShardedTensor, plain)."""
    if hasattr(value, "to_local"):
        local = value.to_local()
        return list(local.local_shards()) if hasattr(local, "local_shards") else [local]
    if hasattr(value, "local_shards"):
        return [shard.tensor for shard in value.local_shards()]
    return [value] if isinstance(value, torch.Tensor) else []


def flat_state(state: dict[str, object]) -> dict[str, torch.Tensor]:
    """Every local tensor of a (model or optimizer) state dict, cloned, by a stable key."""
    out: dict[str, torch.Tensor] = {}

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, dict):
            for key, sub in value.items():
                walk(f"{prefix}.{key}", sub)
            return
        for i, tensor in enumerate(local_tensors(value)):
            out[f"{prefix}[{i}]"] = tensor.detach().clone()

    walk("", state)
    return out


def tbe_weight_bytes(model: nn.Module) -> int:
    """Bytes the TBE weight buffers' storage holds now (FULLY_SHARDED's slices excluded)."""
    tbes = {id(s.kernel): s.kernel for s in model.shard_states if s.kernel is not None}
    return sum(k.weights_host.untyped_storage().nbytes() for k in tbes.values())
