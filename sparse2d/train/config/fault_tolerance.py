"""The ``fault_tolerance`` config section (named like torchtitan's).

With ``fault_tolerance.enable`` each torchrun world is ONE sharding group (a torchft replica
group); ``fault_tolerance.group_size`` groups form the job. Options that need a replica
dimension inside one world, or that the fault-tolerant sync does not implement, are refused
at load time, before any process group exists (``sparse2d.option_conflicts``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sparse2d.train.config.io import bad, positive


@dataclass(kw_only=True, slots=True)
class FaultToleranceConfig:
    """Fault-tolerant 2D on torchft: a lost rank stops one sharding group, not the job."""

    enable: bool = False
    """Run this torchrun world as one replica group of a fault-tolerant job (``launch/ft_local.sh``)."""
    replica_id: int = 0
    """This group's index in ``0..group_size-1`` (its slice of every global batch)."""
    group_size: int = 1
    """Replica groups in the job ``G`` (torchtitan's name); the global batch is ``G x world x batch``."""
    min_replica_size: int = 1
    """Fewest groups a step may commit with; fewer for ``quorum_timeout_s``: every rank stops."""
    lighthouse: str | None = None
    """torchft lighthouse ``http://host:port``; null: ``$TORCHFT_LIGHTHOUSE``."""
    timeout_s: float = 30.0
    """Cross-group all-reduce, commit vote and heal transfer time limit."""
    quorum_timeout_s: float = 60.0
    """Wait at most this long for a quorum of ``min_replica_size`` groups, then stop with one line."""
    connect_timeout_s: float = 10.0
    """Reaching the lighthouse (checked on every rank before anything starts)."""
    start_wait_s: float = 30.0
    """At launch, wait up to this long for all ``group_size`` groups to join the first quorum."""
    quorum_every: int = 32
    """Form a quorum every N committed steps (and at the first step and after any step that
    did not commit); between, steps reuse the last quorum's groups with no RPC. A lost group is
    still seen at once (the step's all-reduce fails); a restarted group joins within N steps.
    1: a quorum every step (torchft's ``OptimizerWrapper``). 32 rather than 8: the quorum's
    wait fell from 1.0-1.9 to 0.3-0.4 ms a step (docs/fault_tolerance.md)."""
    overlap_quorum: bool = False
    """Run a step's quorum RPC from ``zero_grad()`` until the forward starts, overlapping the
    pipeline's input all-to-all and data loading, when the group cannot be behind (its last
    step committed); false (the default): every quorum blocks before the step
    (``sparse2d.ft.quorum``). Off by default: it measured no faster on CPU (bench/RESULTS.md)."""

    def __post_init__(self) -> None:
        positive(self, "group_size", "min_replica_size", "timeout_s", "quorum_timeout_s")
        positive(self, "connect_timeout_s", "start_wait_s", "quorum_every")
        positive(self, "replica_id", allow_zero=True)
        if self.replica_id >= self.group_size:
            raise bad("replica_id", self.replica_id, f"must be < group_size={self.group_size}")
        if self.min_replica_size > self.group_size:
            raise bad(
                "min_replica_size",
                self.min_replica_size,
                f"exceeds group_size={self.group_size}: no quorum could ever form",
            )
