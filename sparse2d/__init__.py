"""sparse2d: 2D sparse-parallel training of TorchRec recommendation models.

``DMPCollection`` is imported lazily: importing TorchRec takes seconds, and the
config checker and launchers should not pay for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparse2d.errors import ConfigError, PlanError, SyncError, UnsupportedOptimizerError
from sparse2d.mesh import rank_layout, replica_groups

if TYPE_CHECKING:
    from sparse2d.collection import DMPCollection

__all__ = [
    "ConfigError",
    "DMPCollection",
    "PlanError",
    "SyncError",
    "UnsupportedOptimizerError",
    "rank_layout",
    "replica_groups",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "DMPCollection":
        from sparse2d.collection import DMPCollection

        return DMPCollection
    raise AttributeError(f"module 'sparse2d' has no attribute {name!r}")
