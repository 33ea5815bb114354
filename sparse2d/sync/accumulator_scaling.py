"""Momentum-scaled row-wise AdaGrad: make the 2D accumulator grow like 1D's.

Derivation. TorchRec divides the embedding gradient by the size of the group
its all-to-all spans (``comm_ops.GRADIENT_DIVISION``). In 1D over T ranks the
TBE sees ``g = (1/T) sum_T grad_r``; in 2D, replica group j of L ranks sees
``g_j = (1/L) sum_{r in j} grad_r``, and ``g = mean_j g_j`` over the G = T/L
replicas, which is why averaged SGD equals 1D exactly. AdaGrad accumulates
squares: 1D adds ``g**2``, averaged 2D adds ``mean_j g_j**2``. Their ratio is

* 1 when the replicas' gradients agree (``g_j = g``: dense, signal-dominated rows);
* G when a row is hit by one replica group in the interval (``g_j = G g`` there,
  0 elsewhere: ``mean_j g_j**2 = G g**2``) or when the g_j are independent noise.

Embedding rows are sparse, so most updates are the second kind: the averaged 2D
accumulator grows about G times faster than 1D's, shrinking the effective
learning rate. Dividing the averaged increment since the last sync by
``c = G`` (the number of replica groups, as the 2D paper reports) restores 1D
growth, exactly for rows touched by one group per interval. Measured ratios on
the test model are in ``docs/sync_strategies.md`` (momentum scaling).

Implementation on the fused FBGEMM state (no kernel change): keep an fp32 copy
``ref`` of each accumulator at the last sync; after states are averaged set
``acc = ref + (acc - ref) / c`` and ``ref = acc``. Each increment is scaled once.

Two-stage averages (fault tolerance with a module that has ``n`` replicas inside each
world, ``sparse2d.ft.in_world``): stage 1 averages the ``n`` in-world replicas exactly and
unscaled, stage 2 averages the ``G`` worlds, then its scaler divides that module's growth
by ``c = G x n`` (``within``): ``ref + (mean_G(mean_n(acc)) - ref) / (G n)``, which is
in-world 2D's ``ref + (mean_Gn(acc) - ref) / (G n)`` since equal-weight means nest. One
reference (the last landed sync's) serves both stages: scaling stage 1 by ``n`` too would
give the same number once stage 2 lands, but its reference would advance at a sync whose
stage 2 is then dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType

from sparse2d.errors import ConfigError
from sparse2d.sync.shards import ShardState

ACCUMULATING = (
    EmbOptimType.EXACT_ADAGRAD,
    EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    EmbOptimType.ROWWISE_ADAGRAD,
)
"""Fused optimizers whose first state is a sum of squared gradients."""

STATELESS = (EmbOptimType.SGD, EmbOptimType.EXACT_SGD, EmbOptimType.NONE)


def accumulators(shards: list[ShardState]) -> list[torch.Tensor]:
    """The sum-of-squares state of every shard; reject optimizers it does not apply to."""
    return [tensor for _, tensor in _owned_accumulators(shards)]


def _owned_accumulators(shards: list[ShardState]) -> list[tuple[ShardState, torch.Tensor]]:
    found = []
    for shard in shards:
        optimizer = shard.kernel.optimizer if shard.kernel is not None else EmbOptimType.NONE
        if optimizer in STATELESS:
            continue
        if optimizer not in ACCUMULATING:
            raise ConfigError(
                f"sync momentum_scaling=True rescales AdaGrad accumulators, but table "
                f"{shard.table!r} uses {optimizer.name}; use (row-wise) Adagrad or set "
                f"momentum_scaling=False."
            )
        found.append((shard, shard.optimizer_states[0]))
    return found


class AccumulatorScaler:
    """Divides each accumulator's averaged growth since the last sync by ``factor``."""

    def __init__(self, shards: list[ShardState], factor: float) -> None:
        self.factor = float(factor)
        owned = _owned_accumulators(shards)
        self.tensors = [tensor for _, tensor in owned]
        self._owners = [id(shard) for shard, _ in owned]
        self.within = [1] * len(self.tensors)
        """Per accumulator: replicas an earlier, unscaled stage averaged (``average_within``)."""
        self.refs = [t.detach().float().clone() for t in self.tensors]

    def average_within(self, shards: list[ShardState], replicas: int) -> None:
        """``shards``' ``replicas`` copies inside a world are averaged, unscaled, before this
        scaler's average: their growth is divided by ``factor x replicas`` (module docstring)."""
        if replicas < 1:
            raise ConfigError(f"average_within: replicas={replicas!r} must be >= 1")
        ids = {id(shard) for shard in shards}
        self.within = [
            replicas if owner in ids else within
            for owner, within in zip(self._owners, self.within, strict=True)
        ]

    def reset(self) -> None:
        """Take the current accumulators as the reference (after a load or re-alignment)."""
        self.refs = [t.detach().float().clone() for t in self.tensors]

    def apply(self, rows: Mapping[int, Any] | None = None) -> None:
        """Rescale growth since the last call; call right after states were averaged.

        ``rows``: only these rows, by ``id(shard)`` -> a ``(shard, start, end)`` span (a
        streamed sync's fragment); other shards' accumulators are left as they are."""
        with torch.no_grad():
            for tensor, ref, within, owner in zip(
                self.tensors, self.refs, self.within, self._owners, strict=True
            ):
                if rows is not None:
                    if owner not in rows:
                        continue
                    span = rows[owner]
                    tensor, ref = tensor[span.start : span.end], ref[span.start : span.end]
                scaled = ref + (tensor.float() - ref) / (self.factor * within)
                tensor.copy_(scaled)
                ref.copy_(scaled)
