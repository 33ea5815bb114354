"""MP-ZCH (TorchRec's HashZchManagedCollisionModule) trains on CPU and syncs by id in 2D.

World 4, every rank trains on its own batches through sparse2d's CPU insert, the test gives
each replica's live slots its own metadata, then ``sync()``. Expected rows and metadata are
computed here by raw id (plain dicts) from the replicas' pre-sync tables.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.harness import DistWorld
from tests.mc_models import MC_TABLES, ZCH_PROBE, build_mc_model, train_mc


def _zch_modules(model: Any) -> dict[str, Any]:
    from torchrec.distributed.mc_modules import ShardedManagedCollisionCollection

    for sub in model.modules():
        if isinstance(sub, ShardedManagedCollisionCollection):
            return dict(sub._managed_collision_modules.items())
    raise AssertionError("no sharded managed-collision collection")


def snapshot(model: Any) -> dict[str, dict[str, Any]]:
    """Per table: identities, metadata, rows, and {raw id: (slot, weight, states, meta)}."""
    from sparse2d.sync.shards import collect_shard_states

    shards = {s.table: s for s in collect_shard_states(model)}
    out: dict[str, dict[str, Any]] = {}
    for name, mc in _zch_modules(model).items():
        shard = shards[name]
        ids = mc._hash_zch_identities.detach().view(-1).clone()
        meta = mc._hash_zch_metadata.view(-1).clone()
        by_id = {
            int(ids[slot]): (
                slot,
                shard.weight[slot].clone(),
                [s[slot].clone() for s in shard.optimizer_states],
                int(meta[slot]),
            )
            for slot in range(ids.numel())
            if int(ids[slot]) != -1
        }
        out[name] = {
            "ids": ids,
            "meta": meta,
            "by_id": by_id,
            "weight": shard.weight.clone(),
            "states": [s.clone() for s in shard.optimizer_states],
        }
    return out


def window_of(mc: Any) -> Any:
    """raw id -> the local slots of its probe window (FBGEMM's hash, via the module's mapper)."""
    from sparse2d.patches.torchrec_hash_mc_modules import start_slots

    def window(raw: int) -> list[int]:
        values, sizes, offsets = mc.input_mapper(
            values=torch.tensor([raw]), output_offset=mc._output_global_offset_tensor
        )
        start = int(start_slots(values, int(mc._zch_size), sizes, offsets)[0])
        base, size = int(offsets[0]), int(sizes[0])
        return [base + (start - base + k) % size for k in range(ZCH_PROBE)]

    return window


def gather(obj: Any, pg: dist.ProcessGroup) -> list[Any]:
    out: list[Any] = [None] * dist.get_world_size(pg)
    dist.all_gather_object(out, obj, group=pg)
    return out


def check_zch_sync(group_size: int) -> dict[str, int]:
    from torchrec.optim import RowWiseAdagrad

    from sparse2d import DMPCollection

    stats = {"differed": 0, "checked": 0, "single": 0, "dropped": 0, "moved": 0, "max_meta": 0}
    model = DMPCollection(
        build_mc_model(False, optimizer=RowWiseAdagrad, lr=0.05, kind="zch"),
        group_size,
        device="cpu",
    )
    pg, me = model.replica_pg, dist.get_rank(model.replica_pg)
    for round_ in range(2):
        train_mc(model, 4, start=4 * round_)
        gen = torch.Generator().manual_seed(100 * round_ + dist.get_rank())
        for mc in _zch_modules(model).values():  # each replica: its own recency per slot
            meta = mc._hash_zch_metadata.view(-1)
            live = mc._hash_zch_identities.view(-1) != -1
            meta[live] = torch.randint(0, 50, (int(live.sum()),), generator=gen, dtype=meta.dtype)
            meta[live.nonzero()[:1].view(-1)] = 1000 + me  # one hot id per replica
        before = gather(snapshot(model), pg)
        model.sync()
        after = gather(snapshot(model), pg)
        for name, _ in MC_TABLES:
            pre = [rep[name] for rep in before]
            post = [rep[name] for rep in after]
            stats["differed"] += any(not torch.equal(pre[0]["ids"], p["ids"]) for p in pre[1:])
            for other in post[1:]:  # bit-identical: identities, metadata, rows, every state
                for key in ("ids", "meta", "weight"):
                    torch.testing.assert_close(other[key], post[0][key], rtol=0, atol=0)
                for a, b in zip(other["states"], post[0]["states"], strict=True):
                    torch.testing.assert_close(a, b, rtol=0, atol=0)
            got, window = post[0]["by_id"], window_of(_zch_modules(model)[name])
            union = {raw for rep in pre for raw in rep["by_id"]}
            assert set(got) <= union
            hottest = max(
                union, key=lambda r: max(p["by_id"].get(r, (0, 0, 0, -1))[3] for p in pre)
            )
            assert hottest in got, "the id with the highest metadata was dropped"
            for raw in union - set(got):  # dropped only for want of a slot in its window
                stats["dropped"] += 1
                assert all(int(post[0]["ids"][s]) != -1 for s in window(raw)), raw
            for raw, (slot, weight, states, meta) in got.items():
                holders = [rep["by_id"][raw] for rep in pre if raw in rep["by_id"]]
                assert slot in window(raw)
                # TorchRec's merge keeps the max over holders, unless the id was evicted by a
                # fresher id and re-inserted by a later replica with its own (lower) metadata.
                assert meta in {h[3] for h in holders}, (raw, meta)
                stats["max_meta"] += meta == max(h[3] for h in holders)
                stats["moved"] += any(h[0] != slot for h in holders)
                torch.testing.assert_close(weight, torch.stack([h[1] for h in holders]).mean(0))
                for i, state in enumerate(states):
                    want = torch.stack([h[2][i] for h in holders]).mean(0)
                    torch.testing.assert_close(state, want)
                if len(holders) == 1:  # one replica held it: that replica's row, bit for bit
                    stats["single"] += 1
                    torch.testing.assert_close(weight, holders[0][1], rtol=0, atol=0)
                stats["checked"] += 1
            kept = {slot for slot, *_ in got.values()}
            for slot in set(range(post[0]["ids"].numel())) - kept:  # no id: reset
                assert not post[0]["weight"][slot].any()
                assert all(not s[slot].any() for s in post[0]["states"])
    train_mc(model, 1, start=100)  # the synced tables still train
    model.close()
    return stats


@pytest.mark.parametrize("group_size", [2, 1])
def test_zch_replicas_agree_by_id(world4: DistWorld, group_size: int) -> None:
    """L=2: 2 replicas of 2 shards; L=1: 4 replicas of the whole table."""
    stats = world4.run(check_zch_sync, group_size)
    for s in stats:
        assert s["differed"] > 0 and s["checked"] > 0 and s["single"] > 0, s
        assert s["dropped"] > 0 and s["moved"] > 0, s
        assert s["max_meta"] > 0.9 * s["checked"], s
