"""Planning for one sharding group: sharders, plan-for-L and remapping to a group."""

from sparse2d.planner.group_plan import plan_for_group, remap_plan, validate_plan
from sparse2d.planner.sharders import MODEL_PARALLEL_TYPES, default_sharders

__all__ = [
    "MODEL_PARALLEL_TYPES",
    "default_sharders",
    "plan_for_group",
    "remap_plan",
    "validate_plan",
]
