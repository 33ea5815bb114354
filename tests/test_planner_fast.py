"""``group_planner``: TorchRec's planner with few proposals, on meta-device models with a
Topology and no process group. Its plan is rated as well as TorchRec's default planner's
and balances memory and lookup load as well; under tight memory it still finds a plan."""

from __future__ import annotations

import torch
from torchrec import EmbeddingBagCollection
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from sparse2d.planner.fast_planner import group_planner
from sparse2d.planner.sharders import default_sharders


def tables(rows: list[int], dim: int = 32) -> EmbeddingBagCollection:
    configs = [
        EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=dim, num_embeddings=r, feature_names=[f"f{i}"]
        )
        for i, r in enumerate(rows)
    ]
    return EmbeddingBagCollection(tables=configs, device=torch.device("meta"))


def balance(planner: EmbeddingShardingPlanner, ranks: int) -> tuple[float, float, float]:
    """(max per-rank perf, perf max/mean, memory max/mean) of the planner's chosen plan."""
    perf, memory = [0.0] * ranks, [0.0] * ranks
    for option in planner._best_plan or []:
        for shard in option.shards:
            perf[shard.rank] += shard.perf.total
            memory[shard.rank] += shard.storage.ddr + shard.storage.hbm
    return max(perf), max(perf) / (sum(perf) / ranks), max(memory) / (sum(memory) / ranks)


def test_plan_is_rated_and_balanced_like_torchrecs_default() -> None:
    for rows, ranks in (([10_000] * 16, 8), ([40_000, 20_000, 10_000, 5_000, 2_000, 1_000], 4)):
        topology = Topology(world_size=ranks, compute_device="cpu", local_world_size=ranks)
        ours = group_planner(topology, 512, None)
        ours.plan(tables(rows), default_sharders())
        default = EmbeddingShardingPlanner(topology=topology, batch_size=512)
        default.plan(tables(rows), default_sharders())
        mine, theirs = balance(ours, ranks), balance(default, ranks)
        assert ours._num_proposals < default._num_proposals / 5, (ours._num_proposals,)
        assert mine[0] <= theirs[0] * 1.02, (rows, mine, theirs)  # as fast a slowest rank
        assert mine[1] <= theirs[1] * 1.05 and mine[2] <= theirs[2] * 1.05, (rows, mine, theirs)


def test_a_table_too_big_for_one_rank_is_split() -> None:
    """The greedy walks go on while proposals do not fit: one 200k x 32 table (25.6 MB of
    weights) on ranks of 16 MB cannot stay whole."""
    topology = Topology(world_size=4, compute_device="cpu", local_world_size=4, ddr_cap=16 * 2**20)
    plan = group_planner(topology, 64, None).plan(
        tables([200_000, 1_000, 1_000]), default_sharders()
    )
    big = plan.plan[""]["t0"]
    assert big.sharding_type != "table_wise" and len(set(big.ranks)) > 1, big
