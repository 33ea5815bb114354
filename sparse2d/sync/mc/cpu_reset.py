"""Reset evicted rows on CPU, where FBGEMM has no ``reset_weight_momentum`` kernel.

TorchRec's sharded MC-EC/MC-EBC resets a slot whose id was evicted with
``SplitTableBatchedEmbeddingBagsCodegen.reset_embedding_weight_momentum``
(``torchrec/distributed/mc_embedding_modules.py::_evict``). For row-wise AdaGrad that
calls ``fbgemm::reset_weight_momentum``, registered for CUDA only: the first eviction of
an MCH table trained with row-wise AdaGrad on CPU fails inside the forward. The plain
torch path here does what the CUDA kernel does (zero the weight row and its accumulator
for each pruned index of each logical table) and is installed only while the op lacks a
CPU kernel; every other device goes to FBGEMM.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    SplitTableBatchedEmbeddingBagsCodegen,
)

_ORIGINAL = "_sparse2d_original"
_OP = "fbgemm::reset_weight_momentum"


def cpu_kernel_missing() -> bool:
    """True while FBGEMM registers no CPU kernel for ``reset_weight_momentum``."""
    return not torch._C._dispatch_has_kernel_for_dispatch_key(_OP, "CPU")


def reset_rows_(
    tbe: SplitTableBatchedEmbeddingBagsCodegen,
    pruned_indices: torch.Tensor,
    pruned_indices_offsets: torch.Tensor,
    logical_table_ids: torch.Tensor,
) -> None:
    """Zero the weight rows and every optimizer state row at ``pruned_indices`` (local rows of
    the tables ``logical_table_ids``; ``pruned_indices_offsets`` delimits each table's run)."""
    weights = tbe.split_embedding_weights()
    states = tbe.split_optimizer_states()
    offsets = pruned_indices_offsets.tolist()
    with torch.no_grad():
        for i, table in enumerate(logical_table_ids.tolist()):
            rows = pruned_indices[offsets[i] : offsets[i + 1]].long()
            weights[table].data[rows] = 0
            for state in states[table]:
                state.data[rows] = 0


def _on_cpu(original: Callable[..., Any]) -> Callable[..., Any]:
    def reset(
        self: SplitTableBatchedEmbeddingBagsCodegen,
        pruned_indices: torch.Tensor,
        pruned_indices_offsets: torch.Tensor,
        logical_table_ids: torch.Tensor,
        buffer_ids: torch.Tensor,
    ) -> None:
        if (
            self.current_device.type == "cpu"
            and self.optimizer == EmbOptimType.EXACT_ROWWISE_ADAGRAD
        ):
            reset_rows_(self, pruned_indices, pruned_indices_offsets, logical_table_ids)
            return None  # FBGEMM resets row-wise AdaGrad only; other optimizers: no-op there
        return original(self, pruned_indices, pruned_indices_offsets, logical_table_ids, buffer_ids)

    setattr(reset, _ORIGINAL, original)
    return reset


def install_cpu_reset() -> None:
    """Route CPU row resets through ``reset_rows_`` while FBGEMM lacks the CPU kernel."""
    current = SplitTableBatchedEmbeddingBagsCodegen.reset_embedding_weight_momentum
    if not hasattr(current, _ORIGINAL) and cpu_kernel_missing():
        SplitTableBatchedEmbeddingBagsCodegen.reset_embedding_weight_momentum = _on_cpu(current)  # type: ignore[method-assign]
