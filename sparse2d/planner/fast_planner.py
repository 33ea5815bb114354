"""TorchRec's planner, configured to plan one 2D sharding group in seconds at ``L=256``.

``EmbeddingShardingPlanner``'s defaults run four proposers (grid search, two greedy walks,
uniform) that together make hundreds of proposals for a group of 64 ranks and 64 tables;
its ``GreedyPerfPartitioner`` deep-copies every proposal and, for table-row-wise and grid
options, the whole device list per option. At 1,024 ranks (``L=64``) that was ~40-60 s of
one core, at 4,096 (``L=256``, 128 tables) ~395 s. The proposals that decide the plan are
few: each table's fastest option (``GreedyProposer``'s first proposal, by the deepest shard
and by the sum over shards) and one plan per sharding type (``UniformProposer``). The greedy
walks stop once their plans stop improving (``threshold=1``) instead of walking every
option; while proposals do not fit memory they keep walking as before, so a model that
only fits with its larger tables row-wise still gets that plan. The grid-search proposer
is dropped. Planning statistics (a large table logged per plan) are off.

The plan is still TorchRec's: same enumerator, estimators, storage reservation,
partitioner and perf rating; only fewer candidates are rated. ``tests/test_planner_fast.py``
checks its per-rank perf and memory balance against TorchRec's defaults.
"""

from __future__ import annotations

from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.planner.proposers import GreedyProposer, UniformProposer
from torchrec.distributed.planner.stats import NoopEmbeddingStats
from torchrec.distributed.planner.types import ParameterConstraints


def group_planner(
    topology: Topology,
    batch_size: int | None,
    constraints: dict[str, ParameterConstraints] | None,
) -> EmbeddingShardingPlanner:
    """The planner ``DMPCollection`` uses for one sharding group of ``topology.world_size``."""
    kwargs = {"batch_size": batch_size} if batch_size is not None else {}
    return EmbeddingShardingPlanner(
        topology=topology,
        constraints=constraints,
        proposer=[
            GreedyProposer(threshold=1),
            GreedyProposer(use_depth=False, threshold=1),
            UniformProposer(),
        ],
        stats=NoopEmbeddingStats(),
        debug=False,
        **kwargs,
    )
