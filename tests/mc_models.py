"""Managed-collision models (TorchRec MC-EC / MC-EBC with MCH remappers) for the 2D checks."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.optim import _apply_optimizer_in_backward as apply_optimizer_in_backward
from torchrec import EmbeddingBagCollection, EmbeddingCollection, KeyedJaggedTensor
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
from torchrec.modules.hash_mc_evictions import HashZchEvictionConfig, HashZchEvictionPolicyName
from torchrec.modules.hash_mc_modules import HashZchManagedCollisionModule
from torchrec.modules.mc_embedding_modules import (
    ManagedCollisionEmbeddingBagCollection,
    ManagedCollisionEmbeddingCollection,
)
from torchrec.modules.mc_modules import (
    DistanceLFU_EvictionPolicy,
    LFU_EvictionPolicy,
    LRU_EvictionPolicy,
    ManagedCollisionCollection,
    MCHEvictionPolicy,
    MCHManagedCollisionModule,
)
from torchrec.optim.optimizers import in_backward_optimizer_filter

from tests.models import on_rank_device

MC_TABLES = (("m0", 32), ("m1", 48))
"""(name, slots): small row-wise tables, so that replicas' identity sets clash quickly."""
MC_DIM = 8
RAW_IDS = 400
"""Raw id space: ~10x the slots, as a managed-collision table sees in production."""
DENSE = 4
ZCH_PROBE = 4
"""MP-ZCH probe window: short, so that windows fill and replicas' ids compete."""
BUCKETS = 4
"""TorchRec's planner needs a table's buckets to divide evenly over the group's ranks."""

POLICIES: dict[str, Callable[[], MCHEvictionPolicy]] = {
    "lfu": LFU_EvictionPolicy,
    "lru": LRU_EvictionPolicy,
    "distance_lfu": DistanceLFU_EvictionPolicy,
}


class MCModel(nn.Module):
    """An MC-EC (``bagged=False``) or MC-EBC in front of a dense layer."""

    def __init__(
        self,
        bagged: bool,
        policy: str = "lfu",
        device: str = "cpu",
        plain: bool = False,
        kind: str = "mch",
        tables: tuple[tuple[str, int], ...] = MC_TABLES,
        init_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.bagged = bagged
        self.tables = tables
        self.plain = (
            EmbeddingBagCollection(
                tables=[
                    EmbeddingBagConfig(
                        name="p0", embedding_dim=MC_DIM, num_embeddings=64, feature_names=["f_p0"]
                    )
                ],
                device=torch.device(device),
            )
            if plain
            else None
        )
        dev = torch.device(device)
        config = EmbeddingBagConfig if bagged else EmbeddingConfig
        configs = [
            config(
                name=n,
                embedding_dim=MC_DIM,
                num_embeddings=rows,
                feature_names=[f"f_{n}"],
                init_fn=init_fn,
            )
            for n, rows in tables
        ]
        mcc = ManagedCollisionCollection(
            managed_collision_modules={
                n: zch_module(n, rows, dev)
                if kind == "zch"
                else MCHManagedCollisionModule(
                    zch_size=rows,
                    device=dev,
                    eviction_policy=POLICIES[policy](),
                    eviction_interval=1,
                    input_hash_size=RAW_IDS,
                    buckets=BUCKETS,
                )
                for n, rows in tables
            },
            embedding_configs=configs,
        )
        if bagged:
            ebc = EmbeddingBagCollection(tables=configs, device=dev)  # type: ignore[arg-type]
            self.mc = ManagedCollisionEmbeddingBagCollection(ebc, mcc)
        else:
            ec = EmbeddingCollection(tables=configs, device=dev)  # type: ignore[arg-type]
            self.mc = ManagedCollisionEmbeddingCollection(ec, mcc)
        extra = MC_DIM if plain else 0
        self.dense = nn.Linear(len(tables) * MC_DIM + extra + DENSE, 1, device=dev)

    def forward(self, kjt: KeyedJaggedTensor, dense: torch.Tensor) -> torch.Tensor:
        mc_keys = [f"f_{n}" for n, _ in self.tables]
        features = []
        if self.plain is not None:
            split = kjt.split([len(mc_keys), 1])
            kjt = split[0]
            features.append(self.plain(split[1]).to_dict()["f_p0"])
        out, _ = self.mc(kjt)
        for name, _rows in self.tables:
            if self.bagged:
                features.append(out.to_dict()[f"f_{name}"])
                continue
            jt = out[f"f_{name}"]
            rows = torch.arange(dense.shape[0], device=dense.device)
            owner = torch.repeat_interleave(rows, jt.lengths())
            summed = torch.zeros(dense.shape[0], MC_DIM, device=dense.device)
            features.append(summed.index_add(0, owner, jt.values()))
        return self.dense(torch.cat([*features, dense], dim=1)).squeeze(1)


def zch_module(name: str, rows: int, device: torch.device) -> HashZchManagedCollisionModule:
    """TorchRec's MP-ZCH remapper with TTL metadata and a short probe window (collisions)."""
    return HashZchManagedCollisionModule(
        zch_size=rows,
        device=device,
        total_num_buckets=BUCKETS,
        max_probe=ZCH_PROBE,
        input_hash_size=RAW_IDS,
        name=name,
        eviction_policy_name=HashZchEvictionPolicyName.SINGLE_TTL_EVICTION,
        eviction_config=HashZchEvictionConfig(features=[f"f_{name}"], single_ttl=1),
    )


def build_mc_model(
    bagged: bool = False,
    policy: str = "lfu",
    optimizer: type = torch.optim.SGD,
    lr: float = 0.1,
    seed: int = 0,
    plain: bool = False,
    kind: str = "mch",
    tables: tuple[tuple[str, int], ...] = MC_TABLES,
    init_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> MCModel:
    """``plain``: a plain EBC table ``p0`` beside the MC tables (feature ``f_p0`` last);
    ``kind``: ``mch`` (MCHManagedCollisionModule) or ``zch`` (MP-ZCH); ``tables``: other
    ``(name, slots)`` (``mc_batch`` draws features for the names of ``MC_TABLES``);
    ``init_fn``: the tables' initializer, which TorchRec also applies to rows it hands a new id."""
    torch.manual_seed(seed)
    model = MCModel(bagged, policy, plain=plain, kind=kind, tables=tables, init_fn=init_fn)
    apply_optimizer_in_backward(optimizer, model.mc._embedding_module.parameters(), {"lr": lr})
    if model.plain is not None:
        apply_optimizer_in_backward(optimizer, model.plain.parameters(), {"lr": lr})
    return model


def mc_batch(
    step: int, rank: int, batch: int = 16, seed: int = 0, plain: bool = False
) -> tuple[KeyedJaggedTensor, torch.Tensor, torch.Tensor]:
    """Zipf-like raw ids (many repeats of small ids, a long tail), different per rank."""
    gen = torch.Generator().manual_seed(seed * 7919 + step * 131 + rank)
    lengths, values = [], []
    names = [n for n, _ in MC_TABLES] + (["p0"] if plain else [])
    for _name in names:
        length = torch.randint(1, 5, (batch,), generator=gen)
        u = torch.rand(int(length.sum()), generator=gen)
        ids = (RAW_IDS**u).long() - 1  # log-uniform over [0, RAW_IDS)
        lengths.append(length)
        values.append(ids.clamp(0, (64 if _name == "p0" else RAW_IDS) - 1))
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f_{n}" for n in names], values=torch.cat(values), lengths=torch.cat(lengths)
    )
    dense, target = torch.randn(batch, DENSE, generator=gen), torch.randn(batch, generator=gen)
    return on_rank_device(kjt, dense, target)  # SPARSE2D_TEST_DEVICE=cuda (tests.models)


def train_mc(
    model: nn.Module,
    steps: int,
    start: int = 0,
    seed: int = 0,
    plain: bool = False,
    after_step: Callable[[int], object] | None = None,
) -> None:
    """MSE steps on per-rank batches (every replica sees different data)."""
    params = [p for _, p in in_backward_optimizer_filter(model.named_parameters())]
    opt = torch.optim.SGD(params, lr=0.05)
    for step in range(start, start + steps):
        kjt, dense, target = mc_batch(step, dist.get_rank(), seed=seed, plain=plain)
        loss = ((model(kjt, dense) - target) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if after_step is not None:
            after_step(step)
