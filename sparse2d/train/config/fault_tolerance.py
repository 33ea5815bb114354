"""The ``fault_tolerance`` config section (named like torchtitan's).

With ``fault_tolerance.enable`` each torchrun world is ONE sharding group (a torchft replica
group); ``fault_tolerance.num_groups`` groups form the job. Options that need a replica
dimension inside one world, or that the fault-tolerant sync does not implement, are refused
at load time, before any process group exists (``sparse2d.option_conflicts``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from sparse2d.ft.ft_options import FTOptions


@dataclass(kw_only=True, slots=True)
class FaultToleranceConfig(FTOptions):
    """Fault-tolerant 2D on torchft: a lost rank stops one sharding group, not the job. Every
    key but ``enable`` and ``commit_log`` is ``sparse2d.FTOptions``' own field (one source of truth); the groups'
    sync cadence is ``parallel.sync.every``."""

    enable: bool = False
    """Run this torchrun world as one replica group of a fault-tolerant job (``launch/ft_local.sh``)."""
    commit_log: bool = False
    """Append each committed step (step, quorum, SHA-256 of rank 0's state) to
    ``RUN_DIR/replica_<g>/commits.jsonl``, for the chaos run's invariant checker
    (``bench/chaos_check.py``). Hashes rank 0's whole state every step: off for real jobs."""

    renamed_keys: ClassVar[dict[str, str]] = {"group_size": "num_groups"}
    """Keys this section once had, by their name now (the loader names the new key)."""

    def __post_init__(self) -> None:
        FTOptions.__post_init__(self)  # zero-argument super() fails in a slots dataclass

    def options(self, **changes: Any) -> FTOptions:
        """The library's ``FTOptions`` these keys are (with ``changes``), for ``FaultTolerance``."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(FTOptions)}
        return FTOptions(**{**values, **changes})


def disabled() -> FaultToleranceConfig:
    """The section's default: fault tolerance off, one group (keys absent from YAML keep these)."""
    return FaultToleranceConfig(replica_id=0, num_groups=1)
