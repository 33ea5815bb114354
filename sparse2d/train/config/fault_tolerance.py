"""The ``fault_tolerance`` config section (named like torchtitan's) and what it refuses.

With ``fault_tolerance.enable`` each torchrun world is ONE sharding group (a torchft replica
group); ``fault_tolerance.num_groups`` groups form the job. Options that need a replica
dimension inside one world, or that the fault-tolerant sync does not implement, are refused
here, at load time, before any process group exists.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from sparse2d.ft.options import FTOptions
from sparse2d.ft.refusals import option_refusals


@dataclass(kw_only=True, slots=True)
class FaultToleranceConfig(FTOptions):
    """Fault-tolerant 2D on torchft: a lost rank stops one sharding group, not the job. Every
    key but ``enable`` is ``sparse2d.FTOptions``' own field (one source of truth); the groups'
    sync cadence is ``parallel.sync.every``."""

    enable: bool = False
    """Run this torchrun world as one replica group of a fault-tolerant job (``launch/ft_local.sh``)."""

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


_SYNC_FREE = (
    "every",
    "engine",
    "hide",
    "include_optimizer_state",
    "momentum_scaling",
    "compression",
)
"""parallel.sync keys the fault-tolerant sync honours (every; momentum_scaling: c = the groups
in the step's quorum; engine=sparse: the touched-row union agreed over the quorum; compression=
bf16: deltas summed in bf16 over the quorum) or replaces (engine=auto runs dense; hide)."""


def refusals(cfg: Any) -> list[str]:
    """Every option of ``cfg`` that fault-tolerant mode cannot run, as ``key=value (why)``: the
    library's refusals (``sparse2d.ft.refusals.option_refusals``) and the trainer's own."""
    if not cfg.fault_tolerance.enable:
        return []
    p = cfg.parallel
    out = []
    if p.sharding_group_size == "auto":
        out.append(
            "parallel.sharding_group_size='auto' (a group is one torchrun world: leave it null)"
        )
    library = option_refusals(p.sync, p.sharding_strategy == "fully_sharded")
    out += [f"parallel.{key}={value!r} ({why})" for key, value, why in library]
    decided = {key.removeprefix("sync.") for key, _, _ in library}
    default = type(p.sync)()
    for key, value in dataclasses.asdict(p.sync).items():
        if key not in _SYNC_FREE and key not in decided and value != getattr(default, key):
            why = "the fault-tolerant sync is the blocking fp32 average"
            out.append(f"parallel.sync.{key}={value!r} ({why})")
    if p.replica_layout != "intra_host":
        out.append(
            f"parallel.replica_layout={p.replica_layout!r} (a torchrun world is one sharding "
            "group and torchft joins rank r of every group: where replicas sit is where each "
            "group's torchrun runs, not this key)"
        )
    return out
