"""Trainer configuration, ``parallel`` section: the 2D layout and the replica sync."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from sparse2d.errors import ConfigError, KeyValueError
from sparse2d.train.config_io import bad, positive


@dataclass(kw_only=True, slots=True)
class SyncConfig:
    """Replica sync; maps 1:1 onto ``sparse2d.SyncOptions`` (same names and meaning)."""

    every: int = 1
    """Average replicas every N optimizer steps (local SGD in between); 1 = exact 1D semantics."""
    include_optimizer_state: bool = True
    """Average fused optimizer state (accumulators, momenta) along with the weights."""
    delayed_optimizer_state: bool = False
    """Average optimizer state one sync behind the weights (overlapped with the next interval)."""
    momentum_scaling: bool = False
    """Scale the averaged AdaGrad accumulator growth by the number of replica groups (1D-like growth)."""
    overlap: bool = False
    """Overlap the sync all-reduce with the next interval, with delta correction (not bit-exact)."""
    hide: bool = True
    """Run each sync's all-reduce in the background and land it just before the next embedding
    lookup (behind the dense optimizer step and the next batch); exact, same values as blocking."""
    compression: Literal["none", "bf16"] = "none"
    """``none`` (fp32 average) or ``bf16`` (bf16 deltas since the last sync, fp32 master values)."""
    engine: Literal["dense", "sparse", "auto"] = "auto"
    """Values a sync covers: ``dense`` (every row), ``sparse`` (only rows some replica looked up
    since the last sync), ``auto`` (per sync the cheaper of the two by a cost model measured over
    the replica group at start-up and refined from timed syncs; dense with bf16)."""
    divergence_every: int = 0
    """Measure replica divergence before every k-th sync (0 = off)."""
    divergence_rows: int = 32
    """Rows sampled per local shard for the divergence metric."""
    check_finite: bool = True
    """Refuse to average NaN/inf: every rank stops with ``SyncError`` naming the table and rank."""

    def __post_init__(self) -> None:
        positive(self, "every", "divergence_rows")
        positive(self, "divergence_every", allow_zero=True)
        try:
            self.options()
        except ConfigError as error:
            raise KeyValueError("", f": {error}") from None

    def options(self) -> Any:
        """The ``SyncOptions`` these settings describe."""
        from sparse2d.sync.options import SyncOptions

        return SyncOptions(**dataclasses.asdict(self))


@dataclass(kw_only=True, slots=True)
class AutoTrialConfig:
    """``sharding_group_size: auto``: the cost model shortlists, a short trial on the job decides.
    Maps 1:1 onto ``sparse2d.advisor.trial.TrialOptions`` (same names and meaning)."""

    candidates: int = 3
    """Most group sizes to measure (the model's best first, then those within the margin);
    0: no trial, the model-only pick."""
    margin: float = 0.5
    """Measure the ``L`` whose predicted step is within ``(1 + margin)`` x the predicted best."""
    warmup_steps: int = 2
    """Untimed steps per candidate, on the job's first batches."""
    timed_steps: int = 5
    """Timed steps per candidate (same batches, following the warm-up); the median counts."""

    def __post_init__(self) -> None:
        from sparse2d.advisor.trial import RANGES, out_of_range

        for key in RANGES:
            why = out_of_range(key, getattr(self, key))
            if why is not None:
                raise bad(key, getattr(self, key), why)

    def options(self) -> Any:
        """The ``TrialOptions`` these settings describe."""
        from sparse2d.advisor.trial import TrialOptions

        return TrialOptions(**dataclasses.asdict(self))


@dataclass(kw_only=True, slots=True)
class ParallelConfig:
    """The 2D layout: sharding groups of ``L`` ranks, replicated ``world / L`` times."""

    sharding_group_size: int | Literal["auto"] | None = None
    """Ranks per sharding group ``L``; must divide the world size. null: the whole world (1D);
    ``auto``: at start-up the advisor shortlists and a short trial on the job's first batches
    picks the fastest (``parallel.auto``; ``sparse2d plan`` shows the model's table)."""
    replica_layout: Literal["intra_host", "inter_host"] = "intra_host"
    """``intra_host``: replicas of a shard on adjacent ranks; ``inter_host``: contiguous groups."""
    node_group_size: int | None = None
    """Ranks of one group sharing a host (table-row-wise/grid); null: from ``LOCAL_WORLD_SIZE``."""
    sync: SyncConfig = field(default_factory=SyncConfig)
    """Replica sync cadence and options (``parallel.sync.every`` is the sync interval)."""
    auto: AutoTrialConfig = field(default_factory=AutoTrialConfig)
    """The measured ``auto`` trial (used only with ``sharding_group_size: auto``)."""
    sharding_strategy: Literal["default", "fully_sharded"] = "default"
    """``default``: each replica holds its group's embedding shards; ``fully_sharded``: between
    steps each replica holds 1/G of them and every step averages weights and optimizer state
    by reduce-scatter (exact; ``parallel.sync`` must stay at every=1 without overlap,
    compression, delay or scaling; its engine and divergence metric are ignored)."""
    timeout_s: float = 300.0
    """Process-group timeout: a rank stuck this long in a collective fails instead of hanging."""

    def __post_init__(self) -> None:
        if self.sharding_group_size not in (None, "auto"):
            positive(self, "sharding_group_size")
        if self.node_group_size is not None:
            positive(self, "node_group_size")
        positive(self, "timeout_s")
        if self.sharding_strategy == "fully_sharded":
            default = SyncConfig()
            changed = [
                f"sync.{k}={v!r}"
                for k, v in dataclasses.asdict(self.sync).items()
                if k not in ("engine", "divergence_every", "divergence_rows")
                and v != getattr(default, k)
            ] + (["sync.engine='sparse'"] if self.sync.engine == "sparse" else [])
            if changed:
                raise bad(
                    "sharding_strategy",
                    self.sharding_strategy,
                    f"averages every step by a dense reduce-scatter; {', '.join(changed)} "
                    "does not apply: drop it or use sharding_strategy=default",
                )

    def strategy(self) -> Any:
        """TorchRec's ``ShardingStrategy`` for ``sharding_strategy``."""
        from torchrec.distributed.types import ShardingStrategy

        return ShardingStrategy[self.sharding_strategy.upper()]
