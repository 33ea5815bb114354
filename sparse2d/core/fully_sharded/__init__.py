"""FULLY_SHARDED 2D: each replica keeps 1/G of its group's fused embedding buffers at rest.

``slices`` cuts FBGEMM's flat buffers, ``schedule`` runs the per-step gathers and
reduce-scatters, ``surfaces`` keeps every ``nn.Module`` surface valid between steps, and
``checks`` refuses what the schedule cannot honour (pure, before any collective). A
sharding strategy that guards the model's surfaces, so it lives with the model in ``core``
(installed after TorchRec shards); it runs on the sync's ground pieces (ballot, guard,
shards, collectives).
"""

from sparse2d.core.fully_sharded.schedule import FullyShardedEmbeddings, materialized

__all__ = ["FullyShardedEmbeddings", "materialized"]
