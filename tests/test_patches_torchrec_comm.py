"""``patches.torchrec_comm`` (TorchRec's per-process cache of the TWRW/grid intra/cross-node
groups) and ``patches.torchrec_comm_ops`` (the reduce-scatter-v backward on gloo with uneven
splits), each through a real 2D model."""

from __future__ import annotations

import torch
import torch.distributed as dist

from sparse2d import DMPCollection
from tests.models import (
    SPARSE_SYNC_TABLES,
    Table,
    build_model,
    constraints_for,
    full_weights,
    gather_tables,
    load_full_weights,
    make_batch,
    train,
)


def rebuild_full_group_twrw() -> int:
    """Two TWRW models in turn with L = world: the sharding group is the job's own group (it
    outlives the first model), so the cached TWRW pair must not outlive the model's close()."""
    steps = 0
    for _ in range(2):
        model = DMPCollection(
            build_model(SPARSE_SYNC_TABLES),
            4,
            device="cpu",
            constraints=constraints_for(SPARSE_SYNC_TABLES),
            node_group_size=2,
        )
        train(model, SPARSE_SYNC_TABLES, 1)  # the TWRW all-to-alls run on the cached pair
        model.close()
        steps += 1
    return steps


def test_a_second_full_group_twrw_model_after_close_trains(world4) -> None:
    assert world4.run(rebuild_full_group_twrw) == [2] * 4


UNEVEN_TABLES = (Table("r0", 64, 8, "row_wise"), Table("w1", 40, 8, "table_row_wise"))


def _uneven_batch(rank: int):
    return make_batch(UNEVEN_TABLES, 0, rank, batch=4 + 2 * rank)


def check_uneven_batches_row_wise() -> dict:
    """Row-wise and TWRW with a different batch size on every rank (gloo): one step of 2D
    (L=2, 2 replicas, sync) equals the unsharded model on the mean of the ranks' losses."""
    world = dist.get_world_size()
    reference = build_model(UNEVEN_TABLES)
    dense_ref = torch.optim.SGD(reference.dense.parameters(), lr=0.1)
    losses = []
    for rank in range(world):
        kjt, dense, target = _uneven_batch(rank)
        losses.append(((reference(kjt, dense) - target) ** 2).mean())
    (sum(losses) / world).backward()
    dense_ref.step()
    model = DMPCollection(
        build_model(UNEVEN_TABLES),
        2,
        device="cpu",
        constraints=constraints_for(UNEVEN_TABLES),
        node_group_size=1,
    )
    load_full_weights(model, full_weights(build_model(UNEVEN_TABLES)))  # TorchRec re-inits
    dense_opt = torch.optim.SGD(
        [p for n, p in model.named_parameters() if "embedding" not in n], lr=0.1
    )
    kjt, dense, target = _uneven_batch(dist.get_rank())
    ((model(kjt, dense) - target) ** 2).mean().backward()
    dense_opt.step()
    model.sync()
    got = gather_tables(model, UNEVEN_TABLES, model.sharding_pg)
    want = full_weights(reference)
    return {name: float((got[name] - want[name]).abs().max()) for name in want} | {
        "moved": max(
            float((want[n] - full_weights(build_model(UNEVEN_TABLES))[n]).abs().max()) for n in want
        )
    }


def test_row_wise_with_a_different_batch_size_per_rank(world4) -> None:
    for result in world4.run(check_uneven_batches_row_wise):
        assert result.pop("moved") > 1e-4
        assert all(diff < 1e-5 for diff in result.values()), result
