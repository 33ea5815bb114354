"""Fault-tolerant 2D training on torchft: a sharding group is a torchft replica group.

A lost rank stops one sharding group, not the job: the other groups keep committing steps,
and the restarted group heals rank by rank from a live one (no checkpoint read). See
``docs/fault_tolerance.md``. Importing this package does not import torchft; building a
``FaultTolerance`` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparse2d.errors import FaultToleranceError
from sparse2d.ft.ft_options import LIGHTHOUSE_ENV, FTOptions

if TYPE_CHECKING:
    from sparse2d.ft.fault_tolerant_steps import FaultTolerance
    from sparse2d.ft.optim import FTOptimizer

__all__ = ["FTOptimizer", "FTOptions", "FaultTolerance", "FaultToleranceError", "LIGHTHOUSE_ENV"]


def __getattr__(name: str) -> Any:
    if name == "FaultTolerance":
        from sparse2d.ft.fault_tolerant_steps import FaultTolerance

        return FaultTolerance
    if name == "FTOptimizer":
        from sparse2d.ft.optim import FTOptimizer

        return FTOptimizer
    raise AttributeError(f"module 'sparse2d.ft' has no attribute {name!r}")
