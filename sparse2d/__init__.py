"""sparse2d: 2D sparse-parallel training of TorchRec recommendation models."""

from sparse2d.collection import DMPCollection
from sparse2d.errors import ConfigError, PlanError, UnsupportedOptimizerError
from sparse2d.mesh import rank_layout, replica_groups

__all__ = [
    "ConfigError",
    "DMPCollection",
    "PlanError",
    "UnsupportedOptimizerError",
    "rank_layout",
    "replica_groups",
]
__version__ = "0.1.0"
