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
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.mc_embedding import ManagedCollisionEmbeddingCollectionSharder
from torchrec.distributed.mc_embeddingbag import ManagedCollisionEmbeddingBagCollectionSharder
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


def mc_compute_kernels(compute_device_type: str, offered: list[str]) -> list[str]:
    """Kernels of TorchRec's managed-collision sharders the device runs: TorchRec offers
    UVM caching and key-value kernels on every device, and its planner then fails on a CPU
    topology ("Unrecognized or unsupported compute kernel: fused_uvm_caching")."""
    if compute_device_type == "cpu":
        return [EmbeddingComputeKernel.FUSED.value]
    return offered


class ManagedCollisionEmbeddingCollectionSharder2D(ManagedCollisionEmbeddingCollectionSharder):
    """TorchRec's MC-EC sharder over ``EmbeddingCollectionSharder2D`` (row-wise on CPU too)."""

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> list[str]:
        offered = super().compute_kernels(sharding_type, compute_device_type)
        return mc_compute_kernels(compute_device_type, offered)


class ManagedCollisionEmbeddingBagCollectionSharder2D(
    ManagedCollisionEmbeddingBagCollectionSharder
):
    """TorchRec's MC-EBC sharder over ``EmbeddingBagCollectionSharder2D``."""

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> list[str]:
        offered = super().compute_kernels(sharding_type, compute_device_type)
        return mc_compute_kernels(compute_device_type, offered)


def default_sharders(fused_params: dict[str, Any] | None = None) -> list[ModuleSharder[nn.Module]]:
    """The sharders ``DMPCollection`` uses when the caller gives none: plain and
    managed-collision collections (TorchRec's MC sharders are row-wise only)."""
    return [
        EmbeddingBagCollectionSharder2D(fused_params=fused_params),
        EmbeddingCollectionSharder2D(fused_params=fused_params),
        ManagedCollisionEmbeddingBagCollectionSharder2D(
            ebc_sharder=EmbeddingBagCollectionSharder2D(fused_params=fused_params)
        ),
        ManagedCollisionEmbeddingCollectionSharder2D(
            ec_sharder=EmbeddingCollectionSharder2D(fused_params=fused_params)
        ),
    ]
