"""Planning: sharders, plan-for-L, the plan store and remapping to a group; the advisor."""

from sparse2d.planner.group_plan import GroupPlan, plan_for_group, remap_plan, validate_plan
from sparse2d.planner.plan_store import PlanStore
from sparse2d.planner.search import Advice, advise, recommend_group_size
from sparse2d.planner.sharders import MODEL_PARALLEL_TYPES, default_sharders
from sparse2d.planner.topology import PRESETS, ClusterTopology, load_topology
from sparse2d.planner.workload import TableLoad, Workload

__all__ = [
    "MODEL_PARALLEL_TYPES",
    "PRESETS",
    "Advice",
    "ClusterTopology",
    "GroupPlan",
    "PlanStore",
    "TableLoad",
    "Workload",
    "advise",
    "default_sharders",
    "load_topology",
    "plan_for_group",
    "recommend_group_size",
    "remap_plan",
    "validate_plan",
]
