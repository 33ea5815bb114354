"""The group-size advisor: which ``L`` to train at. The cluster (``topology``), the job
(``workload``), the cost model and its terms, the search over divisors, the report and the live
``auto`` answer (``auto_pick``: the cost model's pick). Planning one ``L`` is ``sparse2d.planner``'s."""

from sparse2d.advisor.search import Advice, advise, recommend_group_size
from sparse2d.advisor.topology import PRESETS, ClusterTopology, load_topology
from sparse2d.advisor.workload import TableLoad, Workload

__all__ = [
    "PRESETS",
    "Advice",
    "ClusterTopology",
    "TableLoad",
    "Workload",
    "advise",
    "load_topology",
    "recommend_group_size",
]
