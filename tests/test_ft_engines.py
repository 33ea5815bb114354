"""The touched-row engine under fault tolerance (torchft's managed channel).

2 torchft groups x 2 gloo ranks against in-world 2D (world 4, L=2, 2 replicas) with the same
model (every sharding type plus a 4096-row table few ids touch; row-wise AdaGrad, so weights
and accumulators travel), rows, data and a sync every 2 steps. One launch runs two
fault-tolerant variants in turn (dense, touched rows), each with its own lighthouse and
group store (``tests.ft_groups.fresh_store``: torchft keeps its keys in the group's TCPStore):
- touched rows: the same values as in-world 2D with touched rows and as the dense FT run
  (within 1e-6; only which rows travel differs); the first sync is dense in both groups (one
  healed at the start), the later ones send fewer rows than dense;
- every variant: the groups end bit-identical, every step committed.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.testing import assert_close

from sparse2d.ft.lighthouse import start_lighthouse
from tests.ft_groups import fresh_store, run_groups
from tests.models import SPARSE_SYNC_TABLES, constraints_for, make_batch

GROUPS, SIZE, STEPS, EVERY = 2, 2, 6, 2
VARIANTS = {"dense": {"engine": "dense"}, "sparse": {"engine": "sparse"}}


def _model(**sync_options: object):
    from torchrec.optim import RowWiseAdagrad

    from sparse2d import DMPCollection
    from sparse2d.sync.options import SyncOptions
    from tests.models import build_model

    return DMPCollection(
        build_model(SPARSE_SYNC_TABLES, optimizer=RowWiseAdagrad, lr=0.05),
        SIZE,
        device="cpu",
        constraints=constraints_for(SPARSE_SYNC_TABLES),
        node_group_size=2,
        sync_options=SyncOptions(every=EVERY, **sync_options),  # type: ignore[arg-type]
    )


def _values(shards) -> list[torch.Tensor]:
    """Weights first, then optimizer states (``STATES_FROM`` marks where they start)."""
    from sparse2d.sync.shards import flush_caches, live_tensors

    flush_caches(shards)
    weights = live_tensors(shards, weights=True, states=False)
    states = live_tensors(shards, weights=False, states=True)
    return [t.clone() for t in weights] + [torch.full((1,), -1.0)] + [t.clone() for t in states]


def _dense_opt(model) -> torch.optim.Optimizer:
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    params = [p for _, p in in_backward_optimizer_filter(model.named_parameters())]
    return torch.optim.SGD(params, lr=0.05)


def _ft_variants(group: int, lighthouses: dict[str, str]) -> dict:
    from sparse2d.ft import FaultTolerance, FTOptimizer, FTOptions

    out = {}
    for name, opts in VARIANTS.items():
        torch.manual_seed(0)  # the same start rows in every variant and group
        model = _model(**opts)
        store = fresh_store()  # noqa: F841 (kept alive while the manager uses it)
        options = FTOptions(
            replica_id=group,
            num_groups=GROUPS,
            min_replica_size=GROUPS,
            lighthouse=lighthouses[name],
            timeout_s=20,
            quorum_timeout_s=60,
        )
        ft = FaultTolerance(model, _dense_opt(model), options)
        wrapper, stats = FTOptimizer(ft), []
        last = getattr(ft.policy.engine, "stats", None)  # a new object per touched-row sync
        while ft.step < STEPS:
            wrapper.zero_grad()
            rank = dist.get_rank() * GROUPS + group  # in-world rank of (group, rank)
            kjt, dense, target = make_batch(SPARSE_SYNC_TABLES, ft.position, rank)
            ((model(kjt, dense) - target) ** 2).mean().backward()
            wrapper.step()
            engine_stats = getattr(ft.policy.engine, "stats", None)
            if engine_stats is not last:
                stats.append((engine_stats.rows_synced, engine_stats.rows_total))
                last = engine_stats
        out[name] = {"values": _values(ft.shards), "summary": ft.summary(), "stats": stats}
        ft.shutdown()
        model.close()
    return out


def _in_world() -> dict:
    out = {}
    for name in ("sparse",):
        torch.manual_seed(0)
        model = _model(**VARIANTS[name])
        opt = _dense_opt(model)
        for step in range(STEPS):
            kjt, dense, target = make_batch(SPARSE_SYNC_TABLES, step, dist.get_rank())
            ((model(kjt, dense) - target) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
            model.maybe_sync(step)
        model.sync_policy.finish()
        out[name] = _values(model.shard_states)
        model.close()
    return out


def test_sparse_engine_under_ft_equals_in_world_2d(world4) -> None:
    lighthouses = {name: start_lighthouse(min_replicas=GROUPS) for name in VARIANTS}
    try:
        addresses = {name: lh.address() for name, lh in lighthouses.items()}
        out = run_groups(GROUPS, SIZE, _ft_variants, addresses)
    finally:
        for lighthouse in lighthouses.values():
            lighthouse.shutdown()
    ref = world4.run(_in_world)
    for (g, r), got in out.items():
        expected = ref[r * GROUPS + g]
        for name in VARIANTS:
            summary = got[name]["summary"]
            assert summary["committed_steps"] == STEPS and summary["failed_commits"] == 0, summary
            twin = out[(1 - g, r)][name]["values"]  # the same rank of the other group
            for a, b in zip(got[name]["values"], twin, strict=True):
                assert torch.equal(a, b), f"{name}: groups differ at rank {r}"
        sparse, dense = (got[n]["values"] for n in ("sparse", "dense"))
        for a, b, c in zip(sparse, expected["sparse"], dense, strict=True):
            assert_close(a, b, atol=1e-6, rtol=1e-6, msg=f"sparse FT vs in-world {g}/{r}")
            assert_close(a, c, atol=1e-6, rtol=1e-6, msg=f"sparse FT vs dense FT {g}/{r}")
        stats = got["sparse"]["stats"]
        assert len(stats) == STEPS // EVERY, stats
        # the start's heal (init_sync) makes the first sync dense in both groups (the flag
        # rides with the counts); then touched rows only
        assert stats[0][0] == stats[0][1] and all(a < b for a, b in stats[1:]), stats


def _ft_failed_sync(group: int, lighthouse: str, steps: int) -> dict:
    """Touched rows, one rank per group; at data position 2 group 1 records an error before
    its sync, so its all-reduces are no-ops and group 0's fail (gloo timeout): group 0's
    engine gets garbage back from the agreement."""
    from sparse2d import DMPCollection
    from sparse2d.ft import FaultTolerance, FTOptions
    from sparse2d.sync.options import SyncOptions
    from tests.models import MIXED_TABLES, build_model

    model = DMPCollection(
        build_model(MIXED_TABLES, lr=0.1),
        1,
        device="cpu",
        constraints=constraints_for(MIXED_TABLES),
        sync_options=SyncOptions(engine="sparse"),
    )
    options = FTOptions(
        replica_id=group,
        num_groups=GROUPS,
        min_replica_size=GROUPS,
        lighthouse=lighthouse,
        timeout_s=5,
        quorum_timeout_s=60,
    )
    ft = FaultTolerance(model, _dense_opt(model), options)
    syncs = []
    while ft.step < steps:
        ft.start_step()
        kjt, dense, target = make_batch(MIXED_TABLES, ft.position, group)
        ((model(kjt, dense) - target) ** 2).mean().backward()
        if group == 1 and ft.position == 2:
            ft.manager.report_error(RuntimeError("planted: this group's step failed"))
        ft.sync_embeddings()
        stats = ft.policy.engine.stats
        committed = ft.finish_step()
        syncs.append((committed, stats.rows_synced, stats.rows_total))
    out = {"values": _values(ft.shards), "summary": ft.summary(), "syncs": syncs}
    ft.shutdown()
    return out


def test_sparse_engine_survives_a_failed_sync_and_resyncs_densely() -> None:
    """Nothing crashes on the failed agreement's garbage; both groups discard that step, the
    next sync is dense in both (the flag rides with the counts), the groups end identical."""
    lighthouse = start_lighthouse(min_replicas=GROUPS)
    try:
        out = run_groups(GROUPS, 1, _ft_failed_sync, lighthouse.address(), 5)
    finally:
        lighthouse.shutdown()
    for g in range(GROUPS):
        got = out[(g, 0)]
        assert got["summary"]["failed_commits"] >= 1 and got["summary"]["final_step"] == 5, got
        syncs = got["syncs"]  # (committed, rows sent, rows in all shards) per attempt
        failed = [i for i, (committed, *_) in enumerate(syncs) if not committed]
        assert len(failed) == 1 and syncs[failed[0]][1] == 0, syncs  # garbage: nothing sent
        dense, touched = syncs[failed[0] + 1], syncs[failed[0] + 2]
        assert dense[0] and dense[1] == dense[2], syncs  # every row after the discarded sync
        assert touched[0] and touched[1] < touched[2], syncs  # then touched rows again
    for a, b in zip(out[(0, 0)]["values"], out[(1, 0)]["values"], strict=True):
        assert torch.equal(a, b)
