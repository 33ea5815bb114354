"""sparse2d: 2D sparse-parallel training of TorchRec recommendation models.

The public API is what ``__all__`` lists; everything else is internal. Errors and the layout
helpers are imported at once (no torch); the rest is imported on first use (module
``__getattr__``), because importing TorchRec takes seconds and torchft is only needed for
fault tolerance: the config checker and the launchers should pay for neither.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sparse2d.errors import (
    CheckpointError,
    ClosedError,
    CollectiveCallError,
    ConfigError,
    CorruptCheckpointError,
    FaultToleranceError,
    KeyValueError,
    NoFitError,
    NotARunError,
    PlanError,
    Sparse2DError,
    StoredPlanError,
    SyncError,
    UnsupportedOptimizerError,
)
from sparse2d.known_warnings import ignore_known_warnings
from sparse2d.mesh import rank_layout, replica_groups

if TYPE_CHECKING:
    from sparse2d import checkpoint, patches
    from sparse2d.advisor.auto_pick import pick_group_size
    from sparse2d.ft.fault_tolerant_steps import FaultTolerance
    from sparse2d.ft.ft_options import FTOptions
    from sparse2d.ft.optim import FTOptimizer
    from sparse2d.public_collection import DMPCollection
    from sparse2d.sync.options import SyncOptions, SyncReport

# name -> the module that defines it, imported on first access.
_LAZY = {
    "DMPCollection": "sparse2d.public_collection",
    "SyncOptions": "sparse2d.sync.options",
    "SyncReport": "sparse2d.sync.options",
    "FaultTolerance": "sparse2d.ft.fault_tolerant_steps",
    "FTOptimizer": "sparse2d.ft.optim",
    "FTOptions": "sparse2d.ft.ft_options",
    "pick_group_size": "sparse2d.advisor.auto_pick",
}
_RETIRED = ("TrialOptions", "TrialError", "measured_group_size")
"""Names of the measured ``auto`` trial, retired by measurement (bench/RESULTS.md, section
auto): importing one says so instead of a bare "cannot import name"."""
_SUBMODULES = ("checkpoint", "patches")
"""``sparse2d.checkpoint.save`` (save/load/latest/prune/repair); ``sparse2d.patches`` (which
TorchRec/FBGEMM workarounds the installed versions still need)."""

__all__ = [
    "CheckpointError",
    "ClosedError",
    "CollectiveCallError",
    "ConfigError",
    "CorruptCheckpointError",
    "DMPCollection",
    "FTOptimizer",
    "FTOptions",
    "FaultTolerance",
    "FaultToleranceError",
    "KeyValueError",
    "NoFitError",
    "NotARunError",
    "PlanError",
    "Sparse2DError",
    "StoredPlanError",
    "SyncError",
    "SyncOptions",
    "SyncReport",
    "UnsupportedOptimizerError",
    "checkpoint",
    "ignore_known_warnings",
    "patches",
    "pick_group_size",
    "rank_layout",
    "replica_groups",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    elif name in _RETIRED:  # ImportError: ``from sparse2d import`` drops an AttributeError's text
        raise ImportError(
            f"sparse2d.{name} was retired with the measured auto trial: 'auto' is the cost "
            "model's pick (docs/advisor.md; bench/RESULTS.md, section auto, gives the runs)"
        )
    else:
        raise AttributeError(f"module 'sparse2d' has no attribute {name!r}")
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
