"""FBGEMM resets evicted rows on CUDA only (``reset_weight_momentum`` has no CPU kernel).

Upstream: fbgemm_gpu/split_table_batched_embeddings_ops_training.py:4049
(``SplitTableBatchedEmbeddingBagsCodegen.reset_embedding_weight_momentum`` calls
``torch.ops.fbgemm.reset_weight_momentum``, registered for CUDA only), called by TorchRec's
sharded MC-EC/MC-EBC when an id is evicted (``torchrec/distributed/mc_embedding_modules.py:184``).
Issue: none found (searched: reset_weight_momentum CPU; the op came CUDA-only in
https://github.com/pytorch/FBGEMM/pull/1406).
Without it: the first eviction of a managed-collision table trained with row-wise AdaGrad on
CPU fails inside the forward.
Probe: ``needed()`` asks the dispatcher whether ``fbgemm::reset_weight_momentum`` has a CPU
kernel.
Fix: on CPU with row-wise AdaGrad, zero the weight row and every optimizer-state row of each
pruned index of each logical table in plain torch, as the CUDA kernel does; FBGEMM resets
nothing for other optimizers, and other devices go to FBGEMM.
Regression test: ``tests/test_patches_fbgemm_tbe_training.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    SplitTableBatchedEmbeddingBagsCodegen,
)

from sparse2d.patches._base import Patch, is_patched, mark

_OP = "fbgemm::reset_weight_momentum"
_SITE = (
    "fbgemm_gpu.split_table_batched_embeddings_ops_training:"
    "SplitTableBatchedEmbeddingBagsCodegen.reset_embedding_weight_momentum"
)


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

    return mark(reset, original)


def needed() -> bool:
    """True while FBGEMM registers no CPU kernel for ``reset_weight_momentum``."""
    return not torch._C._dispatch_has_kernel_for_dispatch_key(_OP, "CPU")


def apply() -> None:
    """Route CPU row resets through ``reset_rows_`` while FBGEMM lacks the CPU kernel
    (idempotent)."""
    current = SplitTableBatchedEmbeddingBagsCodegen.reset_embedding_weight_momentum
    if not is_patched(current) and needed():
        SplitTableBatchedEmbeddingBagsCodegen.reset_embedding_weight_momentum = _on_cpu(current)  # type: ignore[method-assign]


PATCHES = (
    Patch(
        name="fbgemm_tbe_training",
        upstream="fbgemm_gpu/split_table_batched_embeddings_ops_training.py:4049",
        issue="none found; the op came CUDA-only in https://github.com/pytorch/FBGEMM/pull/1406",
        breaks="first eviction of an MC table with row-wise AdaGrad on CPU fails in the forward",
        probe="the dispatcher has no CPU kernel for fbgemm::reset_weight_momentum",
        needed=needed,
        apply=apply,
        sites=(_SITE,),
        devices=("cpu",),  # FBGEMM has the CUDA kernel
    ),
)
