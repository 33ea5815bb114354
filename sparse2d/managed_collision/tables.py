"""Find managed-collision tables and refuse what sparse2d cannot sync (before any collective).

``check_managed_collision`` runs on the unsharded module, identically on every rank, during
``DMPCollection`` validation; ``find_mc_tables`` pairs each sharded MCH module with the
embedding shards whose rows it hands out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn
from torchrec.distributed.mc_modules import ShardedManagedCollisionCollection
from torchrec.modules.hash_mc_modules import HashZchManagedCollisionModule
from torchrec.modules.mc_modules import (
    DistanceLFU_EvictionPolicy,
    LFU_EvictionPolicy,
    LRU_EvictionPolicy,
    ManagedCollisionCollection,
    MCHManagedCollisionModule,
)

from sparse2d.errors import ConfigError
from sparse2d.sync.shards import ShardState


@dataclass
class MCTable:
    """One local shard of an MCH-managed table: its remapper and its embedding shards."""

    name: str
    module: MCHManagedCollisionModule
    shards: list[ShardState]
    """Usually one; column pieces of the same rows if the plan splits columns too."""
    policy: str
    decay: float

    @property
    def offset(self) -> int:
        return int(self.module._output_global_offset)

    @property
    def size(self) -> int:
        return int(self.module._zch_size)


def policy_name(module: MCHManagedCollisionModule) -> tuple[str, float]:
    """``(lfu | lru | distance_lfu, decay exponent)`` of an MCH module's eviction policy."""
    policy = module._eviction_policy
    if isinstance(policy, DistanceLFU_EvictionPolicy):
        return "distance_lfu", float(policy._decay_exponent)
    if isinstance(policy, LRU_EvictionPolicy):
        return "lru", float(policy._decay_exponent)
    if isinstance(policy, LFU_EvictionPolicy):
        return "lfu", 1.0
    raise ConfigError(
        f"managed-collision module {module._name!r} uses eviction policy "
        f"{type(policy).__name__}, which sparse2d cannot merge across replicas; use "
        "LFU_EvictionPolicy, LRU_EvictionPolicy or DistanceLFU_EvictionPolicy."
    )


def mc_modules(module: nn.Module) -> dict[str, nn.Module]:
    """``{path.table: managed-collision module}`` of an unsharded model."""
    found: dict[str, nn.Module] = {}
    for path, sub in module.named_modules():
        if isinstance(sub, ManagedCollisionCollection):
            for table, mc in sub._managed_collision_modules.items():
                found[f"{path}.{table}" if path else table] = mc
    return found


def check_zch(name: str, mc: HashZchManagedCollisionModule) -> None:
    """Refuse MP-ZCH options whose state the 2D sync and the CPU insert do not carry."""
    if mc._opt_in_prob != -1:
        raise ConfigError(
            f"MP-ZCH module {name} (HashZchManagedCollisionModule) uses opt_in_prob="
            f"{mc._opt_in_prob} (reserved slots): sparse2d's CPU insert and 2D sync do not "
            "implement reserved slots; leave opt_in_prob=-1."
        )
    if mc._hash_zch_runtime_meta is not None:
        raise ConfigError(
            f"MP-ZCH module {name} (HashZchManagedCollisionModule) keeps runtime metadata "
            "(track_id_freq / write_runtime_meta_dim), which sparse2d's 2D sync would not "
            "move with its ids; turn both off."
        )


MC_2D_TORCHREC = (1, 7)
"""The first TorchRec whose sharded managed-collision collection gathers table sizes over the
sharding group (``ShardingEnv2D.sharding_pg``); before it, over the whole world, which fails
inside TorchRec in any 2D world (seen with 1.6.1 on the lent GPU machine)."""


def check_torchrec_mc_2d(names: list[str], version: str | None = None) -> None:
    """Refuse managed-collision tables on a TorchRec without 2D support for them, with the
    version to install (``version``: the installed ``torchrec.__version__`` by default)."""
    if version is None:
        import torchrec

        version = torchrec.__version__
    parts = version.split("+")[0].split(".")
    release = tuple(int(p) if p.isdigit() else 0 for p in parts[:2])
    if release < MC_2D_TORCHREC:
        raise ConfigError(
            f"managed-collision tables ({', '.join(names)}) need TorchRec >= "
            f"{'.'.join(map(str, MC_2D_TORCHREC))} in 2D: "
            f"TorchRec {version} gathers their sizes over the whole world instead of the "
            "sharding group (torchrec/distributed/mc_modules.py). Install torchrec>=1.8 (what "
            "sparse2d is tested on, docs/patches.md)."
        )


def check_managed_collision(module: nn.Module) -> list[str]:
    """Raise ``ConfigError`` for a managed-collision module sparse2d cannot sync correctly;
    return the names of the model's managed-collision tables (the options they cannot run
    with are ``sparse2d.option_conflicts``' rules). Pure (no collective)."""
    found = mc_modules(module)
    if not found:
        return []
    check_torchrec_mc_2d(sorted(found))
    for name, mc in found.items():
        if isinstance(mc, HashZchManagedCollisionModule):
            check_zch(name, mc)
            continue
        if not isinstance(mc, MCHManagedCollisionModule):
            raise ConfigError(
                f"managed-collision module {name} is a {type(mc).__name__}: sparse2d syncs "
                "MCHManagedCollisionModule and HashZchManagedCollisionModule only."
            )
        policy_name(mc)
    return sorted(found)


def find_mc_tables(model: nn.Module, shards: list[ShardState]) -> list[MCTable]:
    """Pair every sharded MCH module in ``model`` with the shards of ``shards`` it remaps to."""
    tables: list[MCTable] = []
    for sub in model.modules():
        if not isinstance(sub, ShardedManagedCollisionCollection):
            continue
        for name, mc in sub._managed_collision_modules.items():
            if not isinstance(mc, MCHManagedCollisionModule):
                continue  # MP-ZCH: managed_collision.zch_sync
            offset, size = int(mc._output_global_offset), int(mc._zch_size)
            mine = [
                s for s in shards if s.table == name and s.row_offset == offset and s.rows == size
            ]
            if not mine:
                continue  # another context's table
            policy, decay = policy_name(mc)
            tables.append(MCTable(name, mc, mine, policy, decay))
    return tables


def sharded_mc_table_names(model: nn.Module) -> list[str]:
    """Names of the sharded managed-collision tables in ``model`` (sorted; pure)."""
    return sorted(
        table
        for sub in model.modules()
        if isinstance(sub, ShardedManagedCollisionCollection)
        for table in sub._managed_collision_modules
    )
