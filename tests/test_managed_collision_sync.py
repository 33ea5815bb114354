"""Managed-collision (MCH) tables in 2D: replicas agree on which id owns which row.

World 4, every rank trains on its own batches (so each replica inserts and evicts its own
ids), then ``sync()``. The expected state is computed here from the replicas' pre-sync
tables by id (plain Python dicts), not with ``sparse2d.managed_collision.merge``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.harness import DistWorld
from tests.mc_models import MC_TABLES, build_mc_model, train_mc
from tests.models import rank_device

MAX = torch.iinfo(torch.int64).max


def _mch_modules(model: Any) -> dict[str, Any]:
    from torchrec.distributed.mc_modules import ShardedManagedCollisionCollection

    for sub in model.modules():
        if isinstance(sub, ShardedManagedCollisionCollection):
            return dict(sub._managed_collision_modules.items())
    raise AssertionError("no sharded managed-collision collection")


def snapshot(model: Any) -> dict[str, dict[str, Any]]:
    """Per table: buffers, and {raw id: (row, weight row, state rows, metadata)}."""
    from sparse2d.sync.shards import collect_shard_states

    shards = {s.table: s for s in collect_shard_states(model)}
    out: dict[str, dict[str, Any]] = {}
    for name, mc in _mch_modules(model).items():
        shard = shards[name]
        offset = int(mc._output_global_offset)
        ids = mc._mch_sorted_raw_ids.clone()
        rows = mc._mch_remapped_ids_mapping.clone() - offset
        meta = {k: getattr(mc, f"_mch_{k}").clone() for k in sorted(mc._mch_metadata)}
        by_id = {}
        for pos in range(ids.numel() - 1):  # the last position is TorchRec's sentinel
            if int(ids[pos]) == MAX:
                continue
            row = int(rows[pos])
            by_id[int(ids[pos])] = (
                row,
                shard.weight[row].clone(),
                [s[row].clone() for s in shard.optimizer_states],
                {k: int(v[pos]) for k, v in meta.items()},
            )
        out[name] = {
            "ids": ids,
            "rows": rows,
            "meta": meta,
            "by_id": by_id,
            "weight": shard.weight.clone(),
            "states": [s.clone() for s in shard.optimizer_states],
            "size": ids.numel(),
            "iter": int(mc._current_iter),
            "miss": (shard.weight[-1].clone(), [s[-1].clone() for s in shard.optimizer_states]),
        }
    return out


def gather(obj: Any, pg: dist.ProcessGroup) -> list[Any]:
    out: list[Any] = [None] * dist.get_world_size(pg)
    dist.all_gather_object(out, obj, group=pg)
    return out


def expected_survivors(
    before: list[dict[str, Any]], baseline: dict[int, int] | None, policy: str
) -> tuple[list[int], dict[int, dict[str, int]]]:
    """Metadata per id: counts = baseline + each holder's increase, last access = the latest;
    the best ``Z - 1`` by the policy's score survive (ties: smaller raw id)."""
    merged: dict[int, dict[str, int]] = {}
    for rep in before:
        for raw, (_, _, _, meta) in rep["by_id"].items():
            out = merged.setdefault(raw, {})
            if "counts" in meta:
                base = (baseline or {}).get(raw, 0)
                count = meta["counts"]
                out["counts"] = out.get("counts", base) + (count - base if count >= base else count)
            if "last_access_iter" in meta:
                out["last_access_iter"] = max(
                    out.get("last_access_iter", 0), meta["last_access_iter"]
                )
    now = max(rep["iter"] for rep in before)

    def score(raw: int) -> float:
        meta = merged[raw]
        if policy == "lfu":
            return meta["counts"]
        if policy == "lru":
            return meta["last_access_iter"]
        return meta["counts"] / (now - meta["last_access_iter"] + 1)

    ranked = sorted(merged, key=lambda raw: (-score(raw), raw))
    return sorted(ranked[: before[0]["size"] - 1]), merged


def check_replicas_agree(group_size: int, bagged: bool, policy: str) -> dict[str, int]:
    from torchrec.optim import RowWiseAdagrad

    from sparse2d import DMPCollection

    model = DMPCollection(
        build_mc_model(bagged, policy, optimizer=RowWiseAdagrad, lr=0.05),
        group_size,
        device=rank_device(),
    )
    pg = model.replica_pg
    baseline: dict[str, dict[int, int] | None] = {n: None for n, _ in MC_TABLES}
    stats = {"differed_before": 0, "checked_ids": 0, "single_holder": 0}
    for round_ in range(2):
        train_mc(model, 4, start=4 * round_)
        before = gather(snapshot(model), pg)
        report = model.sync()
        after = gather(snapshot(model), pg)
        assert report.bytes > 0
        for name, _ in MC_TABLES:
            pre = [rep[name] for rep in before]
            post = [rep[name] for rep in after]
            if any(not torch.equal(pre[0]["ids"], p["ids"]) for p in pre[1:]):
                stats["differed_before"] += 1
            for other in post[1:]:  # bit-identical replicas: identities, metadata, rows, state
                torch.testing.assert_close(other["ids"], post[0]["ids"], rtol=0, atol=0)
                torch.testing.assert_close(other["rows"], post[0]["rows"], rtol=0, atol=0)
                for key in post[0]["meta"]:
                    assert torch.equal(other["meta"][key], post[0]["meta"][key]), key
                torch.testing.assert_close(other["weight"], post[0]["weight"], rtol=0, atol=0)
                for a, b in zip(other["states"], post[0]["states"], strict=True):
                    torch.testing.assert_close(a, b, rtol=0, atol=0)
            survivors, merged = expected_survivors(pre, baseline[name], policy)
            got = post[0]["by_id"]
            assert sorted(got) == survivors, (name, sorted(got), survivors)
            for raw, (_row, weight, states, meta) in got.items():
                holders = [rep["by_id"][raw] for rep in pre if raw in rep["by_id"]]
                assert meta == merged[raw], (raw, meta, merged[raw])
                want_w = torch.stack([h[1] for h in holders]).mean(0)
                want_s = [
                    torch.stack([h[2][i] for h in holders]).mean(0) for i in range(len(states))
                ]
                if len(holders) == 1:  # one replica held it: that replica's row, bit for bit
                    stats["single_holder"] += 1
                    torch.testing.assert_close(weight, holders[0][1], rtol=0, atol=0)
                torch.testing.assert_close(weight, want_w)
                for s, w in zip(states, want_s, strict=True):
                    torch.testing.assert_close(s, w)
                stats["checked_ids"] += 1
            used = {row for row, *_ in got.values()} | {post[0]["size"] - 1}
            for row in set(range(post[0]["size"])) - used:  # rows no id keeps: reset
                assert not post[0]["weight"][row].any()
                assert all(not s[row].any() for s in post[0]["states"])
            miss_w = torch.stack([p["miss"][0] for p in pre]).mean(0)  # every miss's row
            torch.testing.assert_close(post[0]["weight"][-1], miss_w)
            baseline[name] = {r: m.get("counts", 0) for r, (_, _, _, m) in got.items()}
        train_mc(model, 1, start=100)  # the synced tables still train
    model.close()
    return stats


@pytest.mark.parametrize(
    "group_size,bagged,policy",
    [(2, False, "lfu"), (1, True, "lfu"), (2, True, "lru"), (1, False, "distance_lfu")],
)
def test_replicas_agree_on_ids_before_averaging(
    world4: DistWorld, group_size: int, bagged: bool, policy: str
) -> None:
    """Regression: sync used to average slot by slot across different ids and leave the
    identity buffers divergent; now ids are merged first and rows averaged by id.
    L=2: 2 replicas of 2 shards each; L=1: 4 replicas of the whole table."""
    stats = world4.run(check_replicas_agree, group_size, bagged, policy)
    assert all(s["differed_before"] > 0 for s in stats)  # the replicas did diverge
    assert all(s["checked_ids"] > 0 and s["single_holder"] > 0 for s in stats)
