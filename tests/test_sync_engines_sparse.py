"""Sparse replica sync (touched rows only) is bit-identical to dense sync.

World 4, sharding groups of L=2 (two replicas of every shard), every sharding
type (TW/CW/RW/TWRW) plus a large row-wise table, EXACT_SGD, row-wise Adagrad
and element-wise Adagrad, plus the cadence and delayed-state schedules.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torchrec.optim import RowWiseAdagrad

from sparse2d.core.collection import DMPCollection
from sparse2d.errors import ConfigError
from sparse2d.sync.collectives import average_
from sparse2d.sync.engines.base import SyncEngine
from sparse2d.sync.engines.dense import DenseEngine
from sparse2d.sync.engines.sparse import SparseEngine
from sparse2d.sync.policy import SyncOptions, SyncPolicy
from tests.models import (
    SPARSE_SYNC_TABLES,
    Table,
    build_model,
    full_weights,
    gather_tables,
    load_full_weights,
    shard_1d,
    train,
)

SEQUENCE_TABLES = tuple(
    Table(t.name, t.rows, 8, t.sharding)
    for t in SPARSE_SYNC_TABLES
    if t.sharding != "table_row_wise"
)
"""EmbeddingCollection: one embedding dimension for all tables, no TWRW sharder."""

OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {}),
    "rowwise_adagrad": (RowWiseAdagrad, {"eps": 1e-8}),
    "adagrad": (torch.optim.Adagrad, {"eps": 1e-8}),
}


def _model(tables: tuple[Table, ...], optimizer: str, kind: str = "pooled") -> DMPCollection:
    from tests.models import constraints_for

    cls, kwargs = OPTIMIZERS[optimizer]
    module = build_model(tables, kind=kind, optimizer=cls, **kwargs)
    weights = full_weights(module)
    model = DMPCollection(module, 2, device="cpu", constraints=constraints_for(tables))
    load_full_weights(model, weights)
    return model


def _assert_same(a: DMPCollection, b: DMPCollection) -> None:
    for x, y in zip(a.shard_states, b.shard_states, strict=True):
        torch.testing.assert_close(x.weight, y.weight, rtol=0, atol=0, msg=x.table)
        for s, t in zip(x.optimizer_states, y.optimizer_states, strict=True):
            torch.testing.assert_close(s, t, rtol=0, atol=0, msg=f"{x.table} state")


def _assert_replicas_equal(model: DMPCollection) -> None:
    for shard in model.shard_states:
        for tensor in [shard.weight, *shard.optimizer_states]:
            copies = [torch.empty_like(tensor) for _ in range(model.num_replicas)]
            dist.all_gather(copies, tensor.contiguous(), group=model.replica_pg)
            for copy in copies[1:]:
                torch.testing.assert_close(copy, copies[0], rtol=0, atol=0, msg=shard.table)


def _policy(model: DMPCollection, every: int, engine: SyncEngine) -> SyncPolicy:
    return SyncPolicy(
        model.shard_states,
        model.replica_pg,
        model.num_replicas,
        SyncOptions(every=every, hide=False),  # blocking: replicas are read right after
        None,
        engine=engine,
    )


# ---- worker-side checks ------------------------------------------------------------------
def check_sparse_equals_dense(optimizer: str, every: int, steps: int, kind: str) -> dict:
    tables = SPARSE_SYNC_TABLES if kind == "pooled" else SEQUENCE_TABLES
    dense, sparse = _model(tables, optimizer, kind), _model(tables, optimizer, kind)
    dense_policy = _policy(dense, every, DenseEngine(dense.shard_states, dense.replica_pg))
    engine = SparseEngine(sparse.shard_states, sparse.replica_pg)
    sparse_policy = _policy(sparse, every, engine)
    sparse_bytes, dense_bytes, paths = [], [], [0, 0]

    def sparse_step(step: int) -> None:
        report = sparse_policy.step(step)
        if report is not None:
            sparse_bytes.append(report.bytes)
            paths[0] += engine.stats.unions_by_ids
            paths[1] += engine.stats.unions_by_bitmap

    def dense_step(step: int) -> None:
        report = dense_policy.step(step)
        if report is not None:
            dense_bytes.append(report.bytes)

    done = 0
    for checkpoint in (1, 4, steps):  # compare after N steps for N in {1, 4, steps}
        n, seed = checkpoint - done, done  # fresh batches per chunk, same for both models
        train(dense, tables, n, after_step=lambda s, d=done: dense_step(s + d), seed=seed)
        train(sparse, tables, n, after_step=lambda s, d=done: sparse_step(s + d), seed=seed)
        done = checkpoint
        _assert_same(dense, sparse)
    _assert_replicas_equal(sparse)
    engine.close()
    return {"sparse": sum(sparse_bytes), "dense": sum(dense_bytes), "paths": paths}


def check_matches_1d() -> None:
    tables = SPARSE_SYNC_TABLES[:4] + SPARSE_SYNC_TABLES[5:]  # 1D planner: no TWRW on 1 host
    module = build_model(tables)
    weights = full_weights(module)
    reference = shard_1d(build_model(tables), tables)
    load_full_weights(reference, weights)
    model = _model(tables, "sgd")
    policy = _policy(model, 1, SparseEngine(model.shard_states, model.replica_pg))
    train(reference, tables, 3)
    train(model, tables, 3, after_step=policy.step)
    expected = gather_tables(reference, tables, None)
    actual = gather_tables(model, tables, model.sharding_pg)
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-5, atol=1e-5, msg=name)


def _sync(engine: SyncEngine, model: DMPCollection, weights: bool, states: bool) -> int:
    payload = engine.payload(weights=weights, states=states)
    average_(payload.buffers, model.replica_pg)
    payload.scatter(payload.buffers)
    engine.synced(weights=weights, states=states)
    return payload.bytes


def check_delayed_states(optimizer: str) -> None:
    """Weights every 2 steps, states one sync later: separate touched sets per kind."""
    tables = SPARSE_SYNC_TABLES
    dense, sparse = _model(tables, optimizer), _model(tables, optimizer)
    engines = [
        DenseEngine(dense.shard_states, dense.replica_pg),
        SparseEngine(sparse.shard_states, sparse.replica_pg),
    ]
    for model, engine in zip((dense, sparse), engines, strict=True):
        pending_states = False

        def after(step: int, model: DMPCollection = model, engine: SyncEngine = engine) -> None:
            nonlocal pending_states
            if step % 2 == 1:
                if pending_states:
                    _sync(engine, model, weights=False, states=True)
                _sync(engine, model, weights=True, states=False)
                pending_states = True

        train(model, tables, 8, after_step=after)
    _assert_same(dense, sparse)
    for model, engine in zip((dense, sparse), engines, strict=True):
        _sync(engine, model, weights=False, states=True)
    _assert_same(dense, sparse)
    _assert_replicas_equal(sparse)
    engines[1].close()


def check_in_flight_window() -> None:
    """Rows looked up while a sync is in flight (delayed state) stay pending for the next sync."""
    tables = SPARSE_SYNC_TABLES
    model = _model(tables, "rowwise_adagrad")
    engine = SparseEngine(model.shard_states, model.replica_pg)
    train(model, tables, 2)
    payload = engine.payload(weights=True, states=True)
    snapshot = [b.clone() for b in payload.buffers]
    average_(payload.buffers, model.replica_pg)
    train(model, tables, 1, seed=7)  # the step while it is in flight: new rows touched
    live = payload.gather()
    corrected = [a + (x - s) for a, x, s in zip(payload.buffers, live, snapshot, strict=True)]
    payload.scatter(corrected)
    engine.synced(weights=True, states=True)
    _sync(engine, model, weights=True, states=True)  # must cover the in-flight step's rows
    _assert_replicas_equal(model)
    engine.close()


def check_crossover_zero_is_dense() -> bool:
    tables = SPARSE_SYNC_TABLES
    model = _model(tables, "rowwise_adagrad")
    engine = SparseEngine(model.shard_states, model.replica_pg, crossover=0.0)
    train(model, tables, 1)
    dense_bytes = DenseEngine(model.shard_states, model.replica_pg).payload(True, True).bytes
    moved = _sync(engine, model, weights=True, states=True)
    touched = engine.stats.dense_shards
    engine.close()
    return moved == dense_bytes and touched > 0


def check_tracker_marks_looked_up_rows() -> None:
    """After one step, every row whose weight changed is marked, and nothing untouched is."""
    tables = SPARSE_SYNC_TABLES
    model = _model(tables, "sgd")
    engine = SparseEngine(model.shard_states, model.replica_pg)
    before = [s.weight.clone() for s in model.shard_states]
    train(model, tables, 1)
    for i, (shard, old) in enumerate(zip(model.shard_states, before, strict=True)):
        changed = torch.nonzero((shard.weight != old).any(1)).squeeze(1)
        marked = engine.tracker.rows_since(i, 0)
        # SGD moves every looked-up row (nonzero gradient) and nothing else: marks are exact.
        assert changed.tolist() == marked.tolist(), shard.table
        assert 0 < marked.numel() <= 2 * 8 * 3, shard.table  # L ranks x batch 8 x <= 3 ids
    # The one-pass counts (one prefix sum per kernel) agree with counting shard by shard.
    for base in (0, 1):
        counts = engine.tracker.counts_since(base).tolist()
        assert counts == [engine.tracker.count_since(i, base) for i in range(len(counts))]
        assert len(counts) == len(model.shard_states) and (base or sum(counts) > 0), counts
    # Column-wise shards of one table (spread over the sharding group) mark the same rows.
    column_wise = {
        shard.col_offset: engine.tracker.rows_since(i, 0).tolist()
        for i, shard in enumerate(model.shard_states)
        if shard.table == "t1"
    }
    everyone: list[dict[int, list[int]]] = [{} for _ in range(model.sharding_group_size)]
    dist.all_gather_object(everyone, column_wise, group=model.sharding_pg)
    merged = {offset: rows for part in everyone for offset, rows in part.items()}
    assert len(merged) >= 2, merged.keys()
    assert all(rows == merged[0] for rows in merged.values()), merged
    engine.close()


def check_policy_options() -> None:
    """Through the real policy (engine="auto"): delayed-state syncs keep replicas exact."""
    tables = SPARSE_SYNC_TABLES
    dense, sparse = _model(tables, "rowwise_adagrad"), _model(tables, "rowwise_adagrad")
    policies = []
    for model, engine in ((dense, "dense"), (sparse, "auto")):
        options = SyncOptions(every=2, delayed_optimizer_state=True, engine=engine, hide=False)
        policies.append(
            SyncPolicy(model.shard_states, model.replica_pg, model.num_replicas, options)
        )
    assert isinstance(policies[1].engine, SparseEngine), type(policies[1].engine)
    for model, policy in zip((dense, sparse), policies, strict=True):
        train(model, tables, 8, after_step=policy.step)
        policy.sync_now()
    _assert_replicas_equal(sparse)
    _assert_same(dense, sparse)
    policies[1].engine.close()  # type: ignore[attr-defined]


# ---- tests -------------------------------------------------------------------------------
@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad", "adagrad"])
def test_sparse_sync_bit_identical_to_dense(world4, optimizer: str) -> None:
    results = world4.run(check_sparse_equals_dense, optimizer, 1, 16, "pooled")
    for r in results:
        assert r["sparse"] * 2 < r["dense"], r  # the large table is barely touched
    assert sum(r["paths"][0] for r in results) > 0  # id-list unions exercised
    assert sum(r["paths"][1] for r in results) > 0  # bitmap unions exercised


def test_sparse_sync_with_cadence(world4) -> None:
    world4.run(check_sparse_equals_dense, "rowwise_adagrad", 4, 16, "pooled")


def test_sparse_sync_sequence_model(world4) -> None:
    world4.run(check_sparse_equals_dense, "sgd", 1, 4, "sequence")


def test_sparse_sync_matches_torchrec_1d(world4) -> None:
    world4.run(check_matches_1d)


@pytest.mark.parametrize("optimizer", ["rowwise_adagrad", "adagrad"])
def test_delayed_optimizer_state(world4, optimizer: str) -> None:
    world4.run(check_delayed_states, optimizer)


def test_policy_auto_engine_with_delayed_state(world4) -> None:
    world4.run(check_policy_options)


def test_in_flight_window_rows_stay_pending(world4) -> None:
    world4.run(check_in_flight_window)


def test_crossover_zero_falls_back_to_dense(world4) -> None:
    assert all(world4.run(check_crossover_zero_is_dense))


def test_tracker_marks_exactly_looked_up_rows(world4) -> None:
    world4.run(check_tracker_marks_looked_up_rows)


def check_paused_tracker() -> dict:
    """Paused, lookups leave no stamp; resumed, every row counts as touched (the rows looked
    up meanwhile are unknown), and lookups stamp again."""
    tables = SPARSE_SYNC_TABLES
    model = _model(tables, "sgd")
    engine = SparseEngine(model.shard_states, model.replica_pg)
    tracker = engine.tracker
    tracker.pause()
    train(model, tables, 1)
    paused = sum(tracker.count_since(i, 0) for i in range(len(model.shard_states)))
    base = tracker.cut()
    tracker.resume()
    everything = [tracker.count_since(i, 0) for i in range(len(model.shard_states))]
    after = tracker.cut()
    train(model, tables, 1)
    stamped = sum(tracker.count_since(i, after) for i in range(len(model.shard_states)))
    engine.close()
    return {
        "paused": paused,
        "all_rows": everything == [s.rows for s in model.shard_states],
        "since_pause": sum(tracker.count_since(i, base) for i in range(len(everything))),
        "stamped_again": stamped > 0,
    }


def test_paused_tracker_resumes_with_every_row_touched(world4) -> None:
    for result in world4.run(check_paused_tracker):
        assert result["paused"] == 0
        assert result["all_rows"] and result["since_pause"] > 0
        assert result["stamped_again"]


def test_bad_crossover_is_config_error() -> None:
    with pytest.raises(ConfigError, match="crossover=1.5"):
        SparseEngine([], None, crossover=1.5)  # type: ignore[arg-type]
