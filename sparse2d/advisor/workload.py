"""What the advisor plans: the embedding tables, the batch and the sync settings (plain data).

The advisor never imports the trainer: applications convert their own configuration
into a ``Workload`` (see ``sparse2d.train.advisor_workload``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from sparse2d.errors import ConfigError

OPTIMIZER_STATE_PER_ROW: dict[str, tuple[int, int]] = {
    # kind: (state values per element, state values per row)
    "sgd": (0, 0),
    "adagrad": (1, 0),
    "rowwise_adagrad": (0, 1),
    "adam": (2, 0),
}
"""Fused optimizer state: FBGEMM keeps ``per_element * cols + per_row`` fp32 values a row."""


@dataclass(frozen=True, slots=True)
class TableLoad:
    """One embedding table and how hard it is used."""

    name: str
    rows: int
    dim: int
    features: int = 1
    """Features looked up in this table (each a bag per sample)."""
    pooling_factor: float = 1.0
    """Mean ids per bag."""
    sharding: str | None = None
    """Forced TorchRec sharding type (``table_wise``, ``row_wise``, ...); None: planner's pick."""

    def __post_init__(self) -> None:
        if self.rows < 1 or self.dim < 1 or self.features < 1 or not self.pooling_factor > 0:
            raise ConfigError(
                f"table {self.name!r}: rows={self.rows}, dim={self.dim}, features="
                f"{self.features}, pooling_factor={self.pooling_factor} must all be positive."
            )


@dataclass(kw_only=True, slots=True)
class Workload:
    """Tables, batch and sync settings of one training job, independent of the group size."""

    tables: tuple[TableLoad, ...]
    """The embedding tables."""
    batch_size_per_rank: int = 512
    """Samples per rank per step."""
    optimizer: Literal["sgd", "adagrad", "rowwise_adagrad", "adam"] = "rowwise_adagrad"
    """Fused embedding optimizer (sets the optimizer state bytes)."""
    sync_every: int = 1
    """Replica sync cadence in steps."""
    include_optimizer_state: bool = True
    """Whether a sync also averages the optimizer state."""
    engine: Literal["dense", "sparse", "auto"] = "dense"
    """Sync engine: every row, touched rows only, or touched rows with dense fallback at 1/2."""
    zipf_exponent: float = 1.1
    """Id popularity skew (0: uniform ids); sets the expected touched rows of the sparse
    engine and of the fused optimizer's per-row work."""
    replica_layout: Literal["intra_host", "inter_host", "auto"] = "intra_host"
    """Where the replicas of a shard sit (adjacent ranks or across hosts); ``auto``: the
    advisor prices both at every ``L`` and keeps the faster (on tiered links the layout
    decides which traffic crosses hosts)."""
    sharding_strategy: Literal["default", "fully_sharded"] = "default"
    """``fully_sharded``: sparse2d's FULLY_SHARDED 2D (weights and state split over replicas)."""
    dense_params: int = 0
    """Dense (MLP) parameters, data-parallel over the whole world."""
    element_bytes: int = 4
    """Bytes per embedding value (fp32)."""
    sparse_crossover: float = field(default=0.5)
    """Touched fraction above which ``auto`` syncs a shard densely."""
    qcomm_forward: str = "fp32"
    """Wire precision of the pooled-embedding all-to-all (TorchRec ``QCommsConfig``)."""
    qcomm_backward: str = "fp32"
    """Wire precision of the gradient all-to-all."""
    pipeline: bool = False
    """A TorchRec train pipeline runs the next batch's input all-to-all beside this step."""
    hide: bool = False
    """``SyncOptions.hide``: a sync's all-reduce runs behind the dense step and the next
    input all-to-all."""
    check_finite: bool = True
    """``SyncOptions.check_finite``: every sync votes on NaN/inf over the job."""
    stream: bool = False
    """``SyncOptions.stream``: the sync spread over its interval, one fragment per step, each
    behind the next step (``hide``) or blocking."""

    def __post_init__(self) -> None:
        if not self.tables:
            raise ConfigError("workload.tables is empty: the advisor needs embedding tables.")
        if self.batch_size_per_rank < 1 or self.sync_every < 1:
            raise ConfigError(
                f"batch_size_per_rank={self.batch_size_per_rank} and sync_every="
                f"{self.sync_every} must be >= 1."
            )
        if not self.zipf_exponent >= 0:
            raise ConfigError(
                f"zipf_exponent={self.zipf_exponent} must be >= 0 (0: uniform ids, ~1.1: "
                "typical recsys skew)."
            )
        if self.optimizer not in OPTIMIZER_STATE_PER_ROW:
            raise ConfigError(
                f"optimizer={self.optimizer!r} is unknown; use {sorted(OPTIMIZER_STATE_PER_ROW)}."
            )
        for key, allowed in (
            ("qcomm_forward", ("fp32", "fp16", "bf16", "fp8", "int8")),
            ("qcomm_backward", ("fp32", "fp16", "bf16", "fp8", "int8")),
            ("engine", ("dense", "sparse", "auto")),
            ("replica_layout", ("intra_host", "inter_host", "auto")),
            ("sharding_strategy", ("default", "fully_sharded")),
        ):
            if getattr(self, key) not in allowed:
                raise ConfigError(f"{key}={getattr(self, key)!r} must be one of {list(allowed)}.")

    def row_state_values(self, cols: int) -> int:
        """Optimizer state values kept per row of a shard ``cols`` wide."""
        per_element, per_row = OPTIMIZER_STATE_PER_ROW[self.optimizer]
        return per_element * cols + per_row

    @property
    def weight_bytes(self) -> int:
        """All embedding weights of the model (one copy)."""
        return sum(t.rows * t.dim for t in self.tables) * self.element_bytes
