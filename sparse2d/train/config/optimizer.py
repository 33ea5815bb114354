"""The ``optimizer`` section of the trainer config: the fused embedding and the dense optimizers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from sparse2d.train.config.io import positive


@dataclass(kw_only=True, slots=True)
class SparseOptimizerConfig:
    """The fused embedding optimizer (applied in backward by FBGEMM)."""

    kind: Literal["sgd", "adagrad", "rowwise_adagrad"] = "rowwise_adagrad"
    """``sgd`` (EXACT_SGD), ``adagrad`` (EXACT_ADAGRAD) or ``rowwise_adagrad`` (EXACT_ROWWISE_ADAGRAD)."""
    lr: float = 0.05
    """Learning rate."""
    eps: float = 1e-8
    """Adagrad epsilon (ignored by sgd)."""

    def __post_init__(self) -> None:
        positive(self, "lr", "eps")


@dataclass(kw_only=True, slots=True)
class DenseOptimizerConfig:
    """The optimizer of the dense (data-parallel) parameters."""

    kind: Literal["sgd", "adagrad", "adam"] = "adagrad"
    """``sgd``, ``adagrad`` or ``adam`` (torch.optim)."""
    lr: float = 0.05
    """Learning rate."""
    eps: float = 1e-8
    """Epsilon of adagrad/adam (ignored by sgd)."""

    def __post_init__(self) -> None:
        positive(self, "lr", "eps")


@dataclass(kw_only=True, slots=True)
class OptimizerConfig:
    """Sparse (embedding) and dense optimizers."""

    sparse: SparseOptimizerConfig = field(default_factory=SparseOptimizerConfig)
    """Embedding optimizer."""
    dense: DenseOptimizerConfig = field(default_factory=DenseOptimizerConfig)
    """Dense optimizer."""
