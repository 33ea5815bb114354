"""Per-module group sizes through TorchRec's ``submodule_configs`` (``sparse2d/core/contexts.py``).

World 4: the ``EmbeddingBagCollection`` is sharded over groups of 2 (2 replicas) and the
``EmbeddingCollection`` over all 4 ranks (1 replica), each with its own mesh, plan and
sync. The reference is TorchRec's 1D ``DistributedModelParallel`` of the same model.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.optim import _apply_optimizer_in_backward as apply_optimizer_in_backward
from torchrec import EmbeddingBagCollection, EmbeddingCollection, KeyedJaggedTensor
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.types import DMPCollectionConfig, ShardingStrategy
from torchrec.optim.optimizers import in_backward_optimizer_filter

from sparse2d import DMPCollection, checkpoint
from sparse2d.sync.options import SyncOptions
from sparse2d.sync.shards import collect_shard_states
from tests.models import (
    MIXED_TABLES,
    SEQUENCE_TABLES,
    PooledModel,
    SequenceModel,
    build_model,
    constraints_for,
    full_weights,
    load_full_weights,
    make_batch,
    rank_device,
    shard_1d,
)

POOLED, SEQUENCE = MIXED_TABLES, SEQUENCE_TABLES
ALL = (*POOLED, *SEQUENCE)
STEPS = 4
LR = 2.0


class MixedModel(nn.Module):
    """An EBC and an EC side by side: the two module types get different group sizes."""

    def __init__(self) -> None:
        super().__init__()
        self.pooled = PooledModel(POOLED)
        self.sequence = SequenceModel(SEQUENCE)

    def forward(self, kjt: KeyedJaggedTensor, dense: torch.Tensor) -> torch.Tensor:
        features = kjt.to_dict()
        pooled = KeyedJaggedTensor.from_jt_dict(
            {f"f_{t.name}": features[f"f_{t.name}"] for t in POOLED}
        )
        sequence = KeyedJaggedTensor.from_jt_dict(
            {f"f_{t.name}": features[f"f_{t.name}"] for t in SEQUENCE}
        )
        return self.pooled(pooled, dense) + self.sequence(sequence, dense)


def build(seed: int = 0, optimizer: type = torch.optim.SGD, lr: float = LR) -> MixedModel:
    torch.manual_seed(seed)
    model = MixedModel()
    for module in (model.pooled.ebc, model.sequence.ec):
        apply_optimizer_in_backward(optimizer, module.parameters(), {"lr": lr})
    return model


def ec_plan(model: nn.Module, group: int):
    """The EC's plan for its own group size, made the TorchRec way (its sharder only)."""
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=group, compute_device="cpu", local_world_size=group),
        constraints=constraints_for(SEQUENCE),
    )
    return planner.collective_plan(model, [EmbeddingCollectionSharder()], dist.group.WORLD)


def per_module(
    seed: int = 0,
    ebc_group: int = 2,
    ec_group: int = 4,
    plan: bool = True,
    optimizer: type = torch.optim.SGD,
    lr: float = LR,
    sync_options: SyncOptions | None = None,
):
    model = build(seed, optimizer, lr)
    config = DMPCollectionConfig(
        module=EmbeddingCollection,
        plan=ec_plan(model, ec_group) if plan else None,
        sharding_group_size=ec_group,
        sharding_strategy=ShardingStrategy.PER_MODULE,
    )
    return DMPCollection(
        model,
        ebc_group,
        device=rank_device(),
        constraints=constraints_for(ALL),
        submodule_configs=[config],
        sharding_strategy=ShardingStrategy.PER_MODULE,
        sync_options=sync_options,
    )


def tables_and_coverage(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    """Full tables (mean over the ranks holding each element) and how many ranks hold each
    element (min == max checked), gathered over the whole world."""
    sums = {t.name: torch.zeros(t.rows, t.dim, dtype=torch.float64) for t in ALL}
    counts = {t.name: torch.zeros(t.rows, t.dim) for t in ALL}
    for s in collect_shard_states(model):
        rows = slice(s.row_offset, s.row_offset + s.rows)
        cols = slice(s.col_offset, s.col_offset + s.cols)
        sums[s.table][rows, cols] += s.weight.double()
        counts[s.table][rows, cols] += 1
    coverage = {}
    for name in sorted(sums):
        dist.all_reduce(sums[name])
        dist.all_reduce(counts[name])
        low, high = int(counts[name].min()), int(counts[name].max())
        if low != high:
            raise AssertionError(f"{name}: held by {low}..{high} ranks, expected uniform")
        coverage[name] = low
    return {n: (sums[n] / counts[n]).float() for n in sums}, coverage


def train(model: nn.Module, sync: bool) -> list[float]:
    dense = torch.optim.SGD(
        [p for _, p in in_backward_optimizer_filter(model.named_parameters())], lr=0.1
    )
    losses = []
    for step in range(STEPS):
        kjt, x, target = make_batch(ALL, step, dist.get_rank())
        loss = ((model(kjt, x) - target) ** 2).mean()
        loss.backward()
        dense.step()
        dense.zero_grad()
        if sync:
            model.sync()
        losses.append(float(loss.detach()))
    return losses


# ---- worker-side checks --------------------------------------------------------------------
def check_per_module_trains_like_1d(path: str) -> dict:
    unsharded = build()
    weights = {**full_weights(unsharded.pooled), **full_weights(unsharded.sequence)}
    reference = shard_1d(build(), ALL)
    load_full_weights(reference, weights)
    ref_losses = train(reference, sync=False)
    expected, _ = tables_and_coverage(reference)
    model = per_module()
    load_full_weights(model, weights)
    start, _ = tables_and_coverage(model)
    losses = train(model, sync=True)
    got, coverage = tables_and_coverage(model)
    diff = max(float((got[n] - expected[n]).abs().max()) for n in expected)
    moved = max(float((got[n] - start[n]).abs().max()) for n in got)
    checkpoint.save(path, model, step=STEPS)
    restored = per_module(seed=1)  # other weights: the load must overwrite all of them
    before_load, _ = tables_and_coverage(restored)
    checkpoint.load(path, restored)
    loaded, _ = tables_and_coverage(restored)
    return {
        "diff": diff,
        "loss_diff": max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True)),
        "moved": moved,
        "coverage": coverage,
        "contexts": [(c.name, c.sharding_group_size, c.num_replicas) for c in model.contexts],
        "round_trip": max(float((loaded[n] - got[n]).abs().max()) for n in got),
        "changed_by_load": max(float((loaded[n] - before_load[n]).abs().max()) for n in got),
    }


def check_repair(ebc_group: int, ec_group: int) -> float:
    """Rank 1 loses its shards in every context; its replicas refill them."""
    model = per_module(ebc_group=ebc_group, ec_group=ec_group, plan=False)
    train(model, sync=True)
    before, _ = tables_and_coverage(model)
    if dist.get_rank() == 1:
        for shard in model.shard_states:
            shard.weight.normal_()
    model.repair_from_replicas([1])
    after, _ = tables_and_coverage(model)
    return max(float((after[n] - before[n]).abs().max()) for n in after)


def check_bad_config(config: object) -> None:
    DMPCollection(build(), 2, device="cpu", submodule_configs=[config])


# ---- tests ---------------------------------------------------------------------------------
def test_per_module_group_sizes_train_like_1d_and_round_trip(world4, tmp_path) -> None:
    results = world4.run(check_per_module_trains_like_1d, str(tmp_path / "ckpt"))
    for result in results:
        assert result["contexts"] == [("default", 2, 2), ("EmbeddingCollection", 4, 1)]
        assert all(result["coverage"][t.name] == 2 for t in POOLED), result["coverage"]
        assert all(result["coverage"][t.name] == 1 for t in SEQUENCE), result["coverage"]
        assert result["moved"] > 1e-2, result
        assert result["diff"] <= 1e-5 and result["loss_diff"] <= 1e-5, result
        assert result["changed_by_load"] > 1e-2 and result["round_trip"] == 0.0, result


def test_per_module_repair_uses_each_contexts_replicas(world4) -> None:
    assert world4.run(check_repair, 1, 2) == [0.0] * 4


def test_repair_refuses_a_context_without_replicas(world4) -> None:
    with pytest.raises(AssertionError, match="has no healthy member"):
        world4.run(check_repair, 2, 4)


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ("not a config", "is not a torchrec DMPCollectionConfig"),
        (DMPCollectionConfig(module=nn.Linear, plan=None, sharding_group_size=2), "no sharder"),
        (
            DMPCollectionConfig(module=EmbeddingBagCollection, plan=None, sharding_group_size=3),
            "submodule_configs[0] (EmbeddingBagCollection): sharding_group_size=3 is outside",
        ),
    ],
)
def test_bad_submodule_config_fails_on_every_rank(world2, config: object, needle: str) -> None:
    with pytest.raises(AssertionError) as info:
        world2.run(check_bad_config, config)
    assert "failed on ranks [0, 1]" in str(info.value) and needle in str(info.value)


def check_missing_type() -> None:
    config = DMPCollectionConfig(module=EmbeddingCollection, plan=None, sharding_group_size=2)
    DMPCollection(build_model(POOLED), 2, device="cpu", submodule_configs=[config])


def test_config_for_a_type_the_model_lacks_fails(world2) -> None:
    with pytest.raises(AssertionError, match="EmbeddingCollection does not occur"):
        world2.run(check_missing_type)
