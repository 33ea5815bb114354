"""Planning: sharders, the plan for one group of ``L`` ranks, the plan store and remapping a
group's plan onto its global ranks. Choosing ``L`` is the advisor's (``sparse2d.advisor``)."""

from sparse2d.planner.group_plan import GroupPlan, plan_for_group, remap_plan, validate_plan
from sparse2d.planner.plan_store import PlanStore
from sparse2d.planner.sharders import MODEL_PARALLEL_TYPES, default_sharders

__all__ = [
    "MODEL_PARALLEL_TYPES",
    "GroupPlan",
    "PlanStore",
    "default_sharders",
    "plan_for_group",
    "remap_plan",
    "validate_plan",
]
