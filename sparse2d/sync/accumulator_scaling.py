"""Momentum-scaled row-wise AdaGrad: make the 2D accumulator grow like 1D's.

Averaged 2D AdaGrad accumulators grow about G times faster than 1D's on sparse rows (the
derivation and the measured factor: docs/sync_strategies.md, momentum scaling). On the fused
FBGEMM state, with no kernel change: keep an fp32 copy ``ref`` of each accumulator at the last
sync; after states are averaged set ``acc = ref + (acc - ref) / c`` with ``c = G``.

Two-stage averages (fault tolerance with ``n`` replicas inside each world,
``sparse2d.ft.in_world``): stage 1 averages in-world unscaled, stage 2 divides by
``c = G x n`` (``within``), which equals in-world 2D's scaling since equal-weight means nest.
One reference (the last landed sync's) serves both stages, so a dropped stage 2 never
advances it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType

from sparse2d.errors import ConfigError
from sparse2d.sync.engines.base import RowSelection
from sparse2d.sync.shards import ShardState

ACCUMULATING = (
    EmbOptimType.EXACT_ADAGRAD,
    EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    EmbOptimType.ROWWISE_ADAGRAD,
)
"""Fused optimizers whose first state is a sum of squared gradients."""

STATELESS = (EmbOptimType.SGD, EmbOptimType.EXACT_SGD, EmbOptimType.NONE)


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

    def apply(self, rows: Mapping[int, list[RowSelection]] | None = None) -> None:
        """Rescale growth since the last call; call right after states were averaged.

        ``rows``: only these rows, by ``id(shard)`` (what a streamed fragment or a touched-rows
        payload averaged); other rows are left as they are."""
        with torch.no_grad():
            for tensor, ref, within, owner in zip(
                self.tensors, self.refs, self.within, self._owners, strict=True
            ):
                factor = self.factor * within
                if rows is None:
                    _rescale(tensor, ref, factor)
                    continue
                for selection in rows.get(owner, ()):
                    start, end, selected = selection.start, selection.end, selection.rows
                    _rescale(tensor[start:end], ref[start:end], factor, selected)


def _rescale(
    tensor: torch.Tensor, ref: torch.Tensor, factor: float, rows: torch.Tensor | None = None
) -> None:
    """``tensor = ref = ref + (tensor - ref) / factor`` on ``rows`` (every row where None)."""
    if rows is None:
        scaled = ref + (tensor.float() - ref) / factor
        tensor.copy_(scaled)
        ref.copy_(scaled)
        return
    if rows.numel() == 0:
        return
    base = ref.index_select(0, rows)
    scaled = base + (tensor.index_select(0, rows).float() - base) / factor
    tensor.index_copy_(0, rows, scaled.to(tensor.dtype))
    ref.index_copy_(0, rows, scaled)
