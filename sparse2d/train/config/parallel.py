"""Trainer configuration, ``parallel`` section: the 2D layout and the replica sync."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from sparse2d.advisor.auto_pick import RETIRED
from sparse2d.sync.options import SyncOptions
from sparse2d.train.config.io import positive


@dataclass(kw_only=True, slots=True)
class ParallelConfig:
    """The 2D layout: sharding groups of ``L`` ranks, replicated ``world / L`` times."""

    retired_keys: ClassVar[dict[str, str]] = {"auto": RETIRED}
    """Keys removed after measurement (the config loader refuses them with this line):
    ``auto`` configured the measured trial of ``sharding_group_size: auto``."""

    sharding_group_size: int | Literal["auto"] | None = None
    """Ranks per sharding group ``L``; must divide the world size. null: the whole world (1D);
    ``auto``: at start-up the advisor's cost model picks (rank 0 decides for every rank; the
    start-up line and ``sparse2d plan`` show its predicted step per ``L``)."""
    replica_layout: Literal["intra_host", "inter_host", "auto"] = "intra_host"
    """``intra_host``: replicas of a shard on adjacent ranks; ``inter_host``: contiguous groups
    (a sharding group inside a host, its replicas on other hosts); ``auto``: the advisor's
    faster layout for each ``L`` on the job's topology (``SPARSE2D_TOPOLOGY``, which
    ``launch/emulated_hosts.sh`` sets; on tiered links the layout decides which traffic
    crosses hosts)."""
    node_group_size: int | None = None
    """Ranks of one group sharing a host (table-row-wise/grid); null: from ``LOCAL_WORLD_SIZE``."""
    sync: SyncOptions = field(default_factory=SyncOptions)
    """Replica sync cadence and options: ``sparse2d.SyncOptions`` itself, with the library's
    defaults (``parallel.sync.every`` is the sync interval)."""
    sharding_strategy: Literal["default", "fully_sharded"] = "default"
    """``default``: each replica holds its group's embedding shards; ``fully_sharded``: between
    steps each replica holds 1/G of them and every step averages weights and optimizer state
    by reduce-scatter (exact; ``parallel.sync`` must stay at every=1 without
    delay or scaling, with optimizer state and ``check_finite``; ``engine:
    sparse`` is refused, ``hide`` and the divergence metric do not apply)."""
    timeout_s: float = 300.0
    """Process-group timeout: a rank stuck this long in a collective fails instead of hanging."""

    def __post_init__(self) -> None:
        if self.sharding_group_size not in (None, "auto"):
            positive(self, "sharding_group_size")
        if self.node_group_size is not None:
            positive(self, "node_group_size")
        positive(self, "timeout_s")

    def strategy(self) -> Any:
        """TorchRec's ``ShardingStrategy`` for ``sharding_strategy``."""
        # here, not at the top: the config loads no torch (the launchers check configs in
        # short processes; tests/test_config_fault_tolerance.py)
        from torchrec.distributed.types import ShardingStrategy

        return ShardingStrategy[self.sharding_strategy.upper()]
