"""Checkpoints and replica repair for a ``DMPCollection``.

``directory``: the ``step_*`` checkpoints, the ``latest`` pointer and pruning (no
collectives); ``dcp``: save/load over ``torch.distributed.checkpoint`` with replica dedup, resharding
to any (world size, group size, plan), an atomic ``latest`` pointer and checks before
any weight changes; ``layout``: the keys and global offsets of each local shard;
``mc_identities``: managed-collision identity tables (saved per shard, checked, rebuilt by id
at another ``L``; the MC sync itself is ``sparse2d.managed_collision``);
``repair_from_replicas`` (``sparse2d.core.replica_repair``, re-exported here): restore a
diverged replica from a healthy one, without a checkpoint.
"""

from sparse2d.checkpoint.dcp import build_save_state, load, save
from sparse2d.checkpoint.directory import latest, list_checkpoints, prune
from sparse2d.core.replica_repair import plan_repair, repair_from_replicas
from sparse2d.errors import CheckpointError, CorruptCheckpointError

__all__ = [
    "CheckpointError",
    "CorruptCheckpointError",
    "build_save_state",
    "latest",
    "list_checkpoints",
    "load",
    "plan_repair",
    "prune",
    "repair_from_replicas",
    "save",
]
