"""Managed collision in front of the DLRM's tables (``model.managed_collision``).

TorchRec's DLRM takes an ``EmbeddingBagCollection``; an MC-EBC returns ``(embeddings,
remapped ids)``. ``ManagedEmbeddingBags`` holds the MC-EBC (which DMP shards with
TorchRec's MC sharder) and gives DLRM the embeddings and the table configs it reads.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torchrec import EmbeddingBagCollection, KeyedJaggedTensor, KeyedTensor
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.hash_mc_evictions import HashZchEvictionConfig, HashZchEvictionPolicyName
from torchrec.modules.hash_mc_modules import HashZchManagedCollisionModule
from torchrec.modules.mc_embedding_modules import ManagedCollisionEmbeddingBagCollection
from torchrec.modules.mc_modules import (
    DistanceLFU_EvictionPolicy,
    LFU_EvictionPolicy,
    LRU_EvictionPolicy,
    ManagedCollisionCollection,
    MCHManagedCollisionModule,
)

from sparse2d.errors import ConfigError
from sparse2d.train.config.model import ManagedCollisionConfig

POLICIES = {
    "lfu": LFU_EvictionPolicy,
    "lru": LRU_EvictionPolicy,
    "distance_lfu": DistanceLFU_EvictionPolicy,
}


class ManagedEmbeddingBags(nn.Module):
    """An MC-EBC with the ``EmbeddingBagCollection`` face DLRM's ``SparseArch`` expects."""

    def __init__(self, mc_ebc: ManagedCollisionEmbeddingBagCollection) -> None:
        super().__init__()
        self.mc_ebc = mc_ebc

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return self.mc_ebc._embedding_module.embedding_bag_configs()  # type: ignore[operator]

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        embeddings, _ = self.mc_ebc(features)
        return embeddings

    @property
    def tables(self) -> EmbeddingBagCollection:
        """The embedding tables (for the fused optimizer)."""
        return self.mc_ebc._embedding_module  # type: ignore[return-value]


def zch(
    config: EmbeddingBagConfig, cfg: ManagedCollisionConfig, buckets: int
) -> HashZchManagedCollisionModule:
    """TorchRec's MP-ZCH remapper for ``config``, with TTL metadata (merged at each 2D sync)."""
    return HashZchManagedCollisionModule(
        zch_size=config.num_embeddings,
        device=torch.device("cpu"),
        total_num_buckets=buckets,
        max_probe=cfg.max_probe,
        input_hash_size=config.num_embeddings * cfg.raw_id_factor,
        name=config.name,
        eviction_policy_name=HashZchEvictionPolicyName.SINGLE_TTL_EVICTION,
        eviction_config=HashZchEvictionConfig(
            features=list(config.feature_names), single_ttl=cfg.ttl_hours
        ),
    )


def managed(
    ebc: EmbeddingBagCollection, cfg: ManagedCollisionConfig, buckets: int
) -> ManagedEmbeddingBags:
    """Put one MCH (or MP-ZCH) module per table of ``ebc`` in front of it; ``buckets`` must divide every
    table's rows and be a multiple of the sharding group size (TorchRec's planner)."""
    configs = ebc.embedding_bag_configs()
    for config in configs:
        if config.num_embeddings % buckets:
            raise ConfigError(
                f"model.managed_collision: table {config.name} has {config.num_embeddings} rows, "
                f"not a multiple of {buckets} (the world size): give it a multiple of {buckets}"
            )
    modules = {
        c.name: zch(c, cfg, buckets)
        if cfg.kind == "zch"
        else MCHManagedCollisionModule(
            zch_size=c.num_embeddings,
            device=torch.device("cpu"),
            eviction_policy=POLICIES[cfg.eviction](),
            eviction_interval=cfg.eviction_interval,
            input_hash_size=c.num_embeddings * cfg.raw_id_factor,
            buckets=buckets,
        )
        for c in configs
    }
    mcc = ManagedCollisionCollection(managed_collision_modules=modules, embedding_configs=configs)
    return ManagedEmbeddingBags(ManagedCollisionEmbeddingBagCollection(ebc, mcc))
