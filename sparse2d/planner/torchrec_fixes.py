"""Narrow workarounds for TorchRec 1.8.0 behaviour that breaks 2D sharding.

Each fix names the TorchRec file it works around, is applied idempotently by
``DMPCollection`` and delegates to TorchRec for every case it does not fix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torchrec.distributed.embedding as trec_embedding
import torchrec.distributed.embeddingbag as trec_embeddingbag
from torchrec.distributed.types import ParameterSharding, ShardingType

_ORIGINAL = "_sparse2d_original"


def _global_shape_with_table_column_wise(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torchrec/distributed/utils.py::create_global_tensor_shape_stride_from_metadata`` has
    no ``TABLE_COLUMN_WISE`` branch and returns ``shape=None``. 2D sharding outputs DTensors,
    and a rank of the group that holds no shard of a TWCW table then crashes in
    ``DTensor.from_local`` (``ShardedEmbeddingBagCollection._initialize_torch_state``).
    TWCW shards are column blocks of the full table, exactly like column-wise ones."""

    def shape_and_stride(
        parameter_sharding: ParameterSharding, devices_per_node: int | None = None
    ) -> tuple[torch.Size, tuple[int, int]]:
        if parameter_sharding.sharding_type != ShardingType.TABLE_COLUMN_WISE.value:
            return original(parameter_sharding, devices_per_node)
        shards = parameter_sharding.sharding_spec.shards  # type: ignore[union-attr]
        rows = shards[0].shard_sizes[0]
        cols = sum(shard.shard_sizes[1] for shard in shards)
        return torch.Size([rows, cols]), (cols, 1)

    setattr(shape_and_stride, _ORIGINAL, original)
    return shape_and_stride


def apply_torchrec_fixes() -> None:
    """Install the workarounds (safe to call many times)."""
    for module in (trec_embeddingbag, trec_embedding):
        current = module.create_global_tensor_shape_stride_from_metadata
        if not hasattr(current, _ORIGINAL):
            module.create_global_tensor_shape_stride_from_metadata = (
                _global_shape_with_table_column_wise(current)
            )
