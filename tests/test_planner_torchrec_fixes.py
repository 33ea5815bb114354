"""``torchrec_fixes``: TorchRec's per-process cache of the TWRW/grid intra/cross-node groups."""

from __future__ import annotations

from sparse2d import DMPCollection
from tests.models import SPARSE_SYNC_TABLES, build_model, constraints_for, train


def rebuild_full_group_twrw() -> int:
    """Two TWRW models in turn with L = world: the sharding group is the job's own group (it
    outlives the first model), so the cached TWRW pair must not outlive the model's close()."""
    steps = 0
    for _ in range(2):
        model = DMPCollection(
            build_model(SPARSE_SYNC_TABLES), 4, device="cpu",
            constraints=constraints_for(SPARSE_SYNC_TABLES), node_group_size=2,
        )  # fmt: skip
        train(model, SPARSE_SYNC_TABLES, 1)  # the TWRW all-to-alls run on the cached pair
        model.close()
        steps += 1
    return steps


def test_a_second_full_group_twrw_model_after_close_trains(world4) -> None:
    assert world4.run(rebuild_full_group_twrw) == [2] * 4
