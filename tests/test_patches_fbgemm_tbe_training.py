"""``patches.fbgemm_tbe_training``: the CPU row reset FBGEMM lacks (``fbgemm::reset_weight_momentum``
is CUDA-only)."""

from __future__ import annotations

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
)

from sparse2d.patches.fbgemm_tbe_training import apply, needed


def tbe(optimizer: EmbOptimType) -> SplitTableBatchedEmbeddingBagsCodegen:
    module = SplitTableBatchedEmbeddingBagsCodegen(
        [
            (6, 4, EmbeddingLocation.HOST, ComputeDevice.CPU),
            (5, 4, EmbeddingLocation.HOST, ComputeDevice.CPU),
        ],
        optimizer=optimizer,
    )
    for w in module.split_embedding_weights():
        w.data.fill_(1.0)
    for states in module.split_optimizer_states():
        for s in states:
            s.data.fill_(2.0)
    return module


def reset(module: SplitTableBatchedEmbeddingBagsCodegen) -> None:
    module.reset_embedding_weight_momentum(
        pruned_indices=torch.tensor([1, 3, 0]),
        pruned_indices_offsets=torch.tensor([0, 2, 3]),
        logical_table_ids=torch.tensor([0, 1], dtype=torch.int32),
        buffer_ids=torch.tensor([0], dtype=torch.int32),
    )


def test_rowwise_adagrad_rows_reset_on_cpu() -> None:
    assert needed()  # else FBGEMM's own kernel runs and this fallback is unused
    apply()
    module = tbe(EmbOptimType.EXACT_ROWWISE_ADAGRAD)
    reset(module)
    weights = module.split_embedding_weights()
    (state0,), (state1,) = module.split_optimizer_states()
    for table, rows, state in ((0, [1, 3], state0), (1, [0], state1)):
        for row in range(weights[table].shape[0]):
            zero = row in rows
            assert bool((weights[table][row] == 0).all()) == zero
            assert float(state[row]) == (0.0 if zero else 2.0)


def test_other_optimizers_untouched_as_fbgemm_does() -> None:
    apply()
    module = tbe(EmbOptimType.EXACT_SGD)
    reset(module)  # FBGEMM resets row-wise AdaGrad only
    assert all(bool((w == 1.0).all()) for w in module.split_embedding_weights())
