"""Per-rank balance from a rank's own shards (real shard views, no process group)."""

from __future__ import annotations

import pytest
import torch

from sparse2d.advisor.balance import local_load, max_over_mean
from sparse2d.advisor.workload import TableLoad
from sparse2d.sync.shards import ShardState


def test_load_and_memory_of_local_shards_by_hand() -> None:
    tables = [TableLoad("a", 100, 8, features=2, pooling_factor=1.5), TableLoad("b", 40, 8)]
    shards = [
        ShardState("a", 0, 0, torch.zeros(50, 8), [torch.zeros(50)]),  # half of a's rows
        ShardState("b", 0, 4, torch.zeros(40, 4), [torch.zeros(40, 4)]),  # half of b's columns
    ]
    load, memory = local_load(shards, tables, group_size=4, batch_size_per_rank=10)
    # a: 4*10 samples * 2 features * 1.5 ids * (50/100 rows) * 8 cols * 4 bytes
    # b: 4*10 samples * 1 feature  * 1 id    * (40/40 rows)  * 4 cols * 4 bytes
    assert load == pytest.approx(4 * 10 * 2 * 1.5 * 0.5 * 8 * 4 + 4 * 10 * 4 * 4)
    assert memory == (50 * 8 + 50 + 40 * 4 + 40 * 4) * 4


def test_max_over_mean() -> None:
    assert max_over_mean([1.0, 1.0, 1.0, 1.0]) == 1.0
    assert max_over_mean([3.0, 1.0]) == pytest.approx(1.5)
    assert max_over_mean([0.0, 0.0]) == 1.0
