"""Find the fused embedding kernels of a sharded model and expose their shards.

FBGEMM's TBE modules hang under each sharded module's ``_lookups``, not as submodules: this
walks there once and returns one ``ShardState`` per local table shard, views into the live
buffers (no copies). The views are taken with ``.data`` (the kernel's storage, not its autograd
version counter): a sync writes outside autograd like the fused kernel, and a version bump
would fail the semi-sync pipeline's backward of the batch it already looked up.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    SplitTableBatchedEmbeddingBagsCodegen,
)
from torchrec.distributed.batched_embedding_kernel import (
    BaseBatchedEmbedding,
    BaseBatchedEmbeddingBag,
)


@dataclass(slots=True)
class ShardState:
    """One local shard of one embedding table, as views into the fused kernel's buffers."""

    table: str
    row_offset: int
    """First row of this shard in the global table."""
    col_offset: int
    """First column of this shard in the global table."""
    weight: torch.Tensor
    """``(rows, cols)`` view of the live weights."""
    optimizer_states: list[torch.Tensor] = field(default_factory=list)
    """Every fused optimizer state tensor: ``(rows,)`` row-wise or ``(rows, cols)`` element-wise."""
    kernel: SplitTableBatchedEmbeddingBagsCodegen | None = None
    index_in_kernel: int = 0
    """Position of this table among the kernel's tables (its ``feature_table_map`` value)."""

    @property
    def rows(self) -> int:
        return self.weight.shape[0]

    @property
    def cols(self) -> int:
        return self.weight.shape[1]


def find_fused_kernels(module: nn.Module) -> list[BaseBatchedEmbedding | BaseBatchedEmbeddingBag]:
    """Return TorchRec's batched embedding kernels (which own an FBGEMM TBE) in ``module``."""
    found: dict[int, nn.Module] = {}
    for sub in module.modules():
        for lookup in getattr(sub, "_lookups", []) or []:
            for candidate in lookup.modules():
                if isinstance(candidate, BaseBatchedEmbedding | BaseBatchedEmbeddingBag):
                    found.setdefault(id(candidate), candidate)
    return list(found.values())  # type: ignore[arg-type]


def collect_shard_states(module: nn.Module) -> list[ShardState]:
    """Return every local table shard of ``module`` with weight and optimizer-state views."""
    shards: list[ShardState] = []
    for kernel in find_fused_kernels(module):
        tbe = kernel.emb_module
        if not isinstance(tbe, SplitTableBatchedEmbeddingBagsCodegen):
            raise TypeError(
                f"sparse2d syncs FBGEMM SplitTableBatchedEmbeddingBagsCodegen kernels; got "
                f"{type(tbe).__name__}. Use the FUSED compute kernel (the default)."
            )
        weights = tbe.split_embedding_weights()
        states = tbe.split_optimizer_states() if _has_states(tbe) else [[] for _ in weights]
        for index, (table, weight, table_states) in enumerate(
            zip(kernel.config.embedding_tables, weights, states, strict=True)
        ):
            metadata = table.local_metadata
            row_offset, col_offset = (
                (metadata.shard_offsets[0], metadata.shard_offsets[1]) if metadata else (0, 0)
            )
            shards.append(
                ShardState(
                    table=table.name,
                    row_offset=int(row_offset),
                    col_offset=int(col_offset),
                    weight=weight.data,
                    optimizer_states=[t.data for t in table_states],
                    kernel=tbe,
                    index_in_kernel=index,
                )
            )
    return shards


def _has_states(tbe: SplitTableBatchedEmbeddingBagsCodegen) -> bool:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    return tbe.optimizer not in (EmbOptimType.EXACT_SGD, EmbOptimType.NONE)


def live_tensors(shards: list[ShardState], weights: bool, states: bool) -> list[torch.Tensor]:
    """The live views of ``shards`` that a sync, broadcast or repair of (weights, states) covers."""
    tensors: list[torch.Tensor] = []
    if weights:
        for shard in shards:
            tensors.append(shard.weight)
    if states:
        for shard in shards:
            tensors.extend(shard.optimizer_states)
    return tensors


def by_dtype(tensors: list[torch.Tensor]) -> dict[torch.dtype, list[torch.Tensor]]:
    """Group tensors by dtype: coalesced collectives take one dtype per call."""
    groups: dict[torch.dtype, list[torch.Tensor]] = defaultdict(list)
    for tensor in tensors:
        groups[tensor.dtype].append(tensor)
    return dict(groups)


def flush_caches(shards: list[ShardState]) -> None:
    """Write back UVM-cached rows so the views hold the current values (CUDA caching only)."""
    seen: set[int] = set()
    for shard in shards:
        tbe = shard.kernel
        if tbe is None or id(tbe) in seen:
            continue
        seen.add(id(tbe))
        if tbe.lxu_cache_weights.numel() > 0:
            tbe.flush()
