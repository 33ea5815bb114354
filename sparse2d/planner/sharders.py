"""Sharders that allow every model-parallel sharding type on CPU too.

TorchRec's ``EmbeddingBagCollectionSharder.sharding_types`` offers row-wise,
table-row-wise and grid sharding only when the compute device is CUDA
(``torchrec/distributed/embedding_types.py``). That is policy: FBGEMM's CPU
TBE and the gloo all-to-all run them fine, and sparse2d's tests verify each one
trains on CPU inside a 2D mesh. Data-parallel tables are left out: in 2D they
would be replicated inside each group and averaged by nobody, so sparse2d only
offers the model-parallel types.
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.types import ModuleSharder, ShardingType

MODEL_PARALLEL_TYPES: tuple[str, ...] = (
    ShardingType.TABLE_WISE.value,
    ShardingType.COLUMN_WISE.value,
    ShardingType.TABLE_COLUMN_WISE.value,
    ShardingType.ROW_WISE.value,
    ShardingType.TABLE_ROW_WISE.value,
    ShardingType.GRID_SHARD.value,
)
"""Sharding types sparse2d offers for ``EmbeddingBagCollection`` on every device."""

SEQUENCE_TYPES: tuple[str, ...] = (
    ShardingType.TABLE_WISE.value,
    ShardingType.COLUMN_WISE.value,
    ShardingType.ROW_WISE.value,
)
"""Sharding types TorchRec implements for ``EmbeddingCollection`` (no TWRW/grid there)."""


class EmbeddingBagCollectionSharder2D(EmbeddingBagCollectionSharder):
    """``EmbeddingBagCollectionSharder`` offering all model-parallel types on CPU and CUDA."""

    def sharding_types(self, compute_device_type: str) -> list[str]:
        return list(MODEL_PARALLEL_TYPES)


class EmbeddingCollectionSharder2D(EmbeddingCollectionSharder):
    """``EmbeddingCollectionSharder`` without data-parallel (meaningless inside a 2D group)."""

    def sharding_types(self, compute_device_type: str) -> list[str]:
        return list(SEQUENCE_TYPES)


def default_sharders(fused_params: dict[str, Any] | None = None) -> list[ModuleSharder[nn.Module]]:
    """The sharders ``DMPCollection`` uses when the caller gives none."""
    return [
        EmbeddingBagCollectionSharder2D(fused_params=fused_params),
        EmbeddingCollectionSharder2D(fused_params=fused_params),
    ]
