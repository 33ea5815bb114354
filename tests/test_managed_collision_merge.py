"""The pure identity merge of MCH replicas (``sparse2d.managed_collision.merge``), worked by hand."""

from __future__ import annotations

import pytest
import torch

from sparse2d.managed_collision.merge import INT64_MAX, Identity, merge

M = INT64_MAX


def table(ids: list[int], rows: list[int], size: int, **meta: list[int]) -> Identity:
    """A ``size``-slot table holding ``ids`` at ``rows`` (sorted like TorchRec keeps it)."""
    order = sorted(range(len(ids)), key=lambda i: ids[i])
    free = [r for r in range(size - 1) if r not in rows]
    pad = size - len(ids)
    return Identity(
        sorted_ids=torch.tensor([ids[i] for i in order] + [M] * pad),
        rows=torch.tensor([rows[i] for i in order] + free + [size - 1]),
        metadata={k: torch.tensor([v[i] for i in order] + [0] * pad) for k, v in meta.items()},
    )


def held(identity: Identity) -> dict[int, int]:
    return {
        int(i): int(r)
        for i, r in zip(identity.sorted_ids, identity.rows, strict=True)
        if int(i) != M
    }


def test_union_keeps_rows_of_the_lowest_replica_and_fills_free_rows() -> None:
    a = table([10, 20], [0, 1], 5, counts=[5, 1])
    b = table([20, 30, 40], [0, 1, 2], 5, counts=[2, 7, 1])
    out = merge([a, b], None, "lfu", current_iter=3)
    # 10, 20 keep replica 0's rows; 40 keeps replica 1's row 2; 30's row 1 is taken -> row 3.
    assert held(out.identity) == {10: 0, 20: 1, 40: 2, 30: 3}
    counts = dict(zip(out.identity.sorted_ids.tolist(), out.identity.metadata["counts"].tolist()))
    assert counts[10] == 5 and counts[20] == 3 and counts[30] == 7 and counts[40] == 1
    assert out.sources.tolist() == [[0, 1, -1, -1, 4], [-1, 0, 2, 1, 4]]
    assert out.holders.tolist() == [1, 2, 1, 1, 2]
    assert out.identity.sorted_ids.tolist()[-1] == M and out.identity.rows.tolist()[-1] == 4


def test_only_the_best_ids_survive_and_their_rows_are_kept() -> None:
    a = table([10, 20], [0, 1], 3, counts=[5, 1])
    b = table([20, 30], [0, 1], 3, counts=[2, 7])
    out = merge([a, b], None, "lfu", current_iter=3)
    assert held(out.identity) == {10: 0, 30: 1}  # 20 (count 3) evicted
    assert out.sources.tolist() == [[0, -1, 2], [-1, 1, 2]]


def test_counts_add_increases_since_the_baseline() -> None:
    base = table([20], [0], 4, counts=[4])
    a = table([20], [0], 4, counts=[6])  # +2 since the last sync
    b = table([20, 50], [0, 1], 4, counts=[5, 2])  # +1, and a new id
    c = table([20], [2], 4, counts=[1])  # evicted and re-inserted: all 1 is new
    out = merge([a, b, c], base, "lfu", current_iter=9)
    counts = dict(zip(out.identity.sorted_ids.tolist(), out.identity.metadata["counts"].tolist()))
    assert counts[20] == 4 + 2 + 1 + 1 and counts[50] == 2
    assert out.holders[held(out.identity)[20]] == 3


def test_ties_go_to_the_smaller_raw_id() -> None:
    a = table([7, 3], [0, 1], 3, counts=[1, 1])
    b = table([5], [0], 3, counts=[1])
    # 7 loses the tie; 5 takes the row 7 left on replica 0 (its own row 0 on replica 1).
    out = merge([a, b], None, "lfu", 1)
    assert held(out.identity) == {3: 1, 5: 0}
    assert out.sources.tolist() == [[-1, 1, 2], [0, -1, 2]]


@pytest.mark.parametrize("policy", ["lru", "distance_lfu"])
def test_recency_policies_take_the_latest_access(policy: str) -> None:
    a = table([1, 2], [0, 1], 3, counts=[9, 1], last_access_iter=[2, 8])
    b = table([3, 1], [0, 1], 3, counts=[1, 1], last_access_iter=[9, 5])
    out = merge([a, b], None, policy, current_iter=10)
    meta = out.identity.metadata
    last = dict(zip(out.identity.sorted_ids.tolist(), meta["last_access_iter"].tolist()))
    if policy == "lru":  # 3 (iter 9) and 2 (iter 8) are the most recent
        assert set(held(out.identity)) == {2, 3}
    else:  # counts / (10 - last + 1): id 1: 10/6, id 3: 1/2, id 2: 1/3
        assert set(held(out.identity)) == {1, 3}
        assert last[1] == 5
        counts = dict(zip(out.identity.sorted_ids.tolist(), meta["counts"].tolist()))
        assert counts[1] == 10


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown MCH eviction policy"):
        merge([table([1], [0], 2, counts=[1])], None, "fifo", 1)
