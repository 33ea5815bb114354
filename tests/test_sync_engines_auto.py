"""``engine="auto"``: cost-chosen dense/touched-rows syncs, bit-identical to dense, agreed.

World 4 as 2 groups of L=2, SPARSE_SYNC_TABLES (every sharding type plus a
4096-row table barely touched by a batch of 8), row-wise Adagrad.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist

from sparse2d.sync.engines.auto import AutoEngine
from sparse2d.sync.engines.choice import DENSE, SPARSE
from sparse2d.sync.engines.cost import LinkCosts, probe
from sparse2d.sync.engines.dense import DenseEngine
from sparse2d.sync.policy import SyncOptions, SyncPolicy
from tests.models import SPARSE_SYNC_TABLES, train
from tests.test_sync_engines_sparse import _assert_replicas_equal, _assert_same, _model, _policy

TABLES = SPARSE_SYNC_TABLES


class Scripted(AutoEngine):
    """Runs the real decision (and its bookkeeping), then follows a script of modes."""

    def __init__(self, *args, script: list[str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._script = itertools.cycle(script)
        self.predictions: list[dict[str, float | None]] = []

    def _choose(self, kinds: list[str], cost: dict) -> str:
        modelled = self.model(kinds)  # predicted seconds per mode (None: union unknown)
        known = modelled[SPARSE] is not None
        self.predictions.append(dict(self.chooser.estimate(modelled)) if known else modelled)
        super()._choose(kinds, cost)
        return next(self._script)


def _modes(pg: dist.ProcessGroup, modes: list[str]) -> list[list[str]]:
    every: list[list[str]] = [[] for _ in range(dist.get_world_size(pg))]
    dist.all_gather_object(every, modes, group=pg)
    return every


# ---- worker-side checks ------------------------------------------------------------------
def check_switching_is_bit_identical(every: int) -> dict:
    """Dense and touched-rows syncs alternate on one model; it matches the dense engine."""
    dense, auto = _model(TABLES, "rowwise_adagrad"), _model(TABLES, "rowwise_adagrad")
    costs = LinkCosts(1e-4, 1e-9, 1e-9, 2e-9, 1e-9)
    engine = Scripted(
        auto.shard_states, auto.replica_pg, costs=costs, script=[SPARSE, DENSE, DENSE, SPARSE]
    )
    dense_policy = _policy(dense, every, DenseEngine(dense.shard_states, dense.replica_pg))
    auto_policy = _policy(auto, every, engine)
    modes: list[str] = []

    def auto_step(step: int) -> None:
        if auto_policy.step(step) is not None:
            modes.append(engine.mode)

    for chunk, done in ((3, 0), (5, 3)):  # compare mid-interval too; fresh batches per chunk
        train(
            dense, TABLES, chunk, after_step=lambda s, d=done: dense_policy.step(s + d), seed=done
        )
        train(auto, TABLES, chunk, after_step=lambda s, d=done: auto_step(s + d), seed=done)
        _assert_same(dense, auto)
    _assert_replicas_equal(auto)
    engine.close()
    known = [p for p in engine.predictions[1:] if p[SPARSE] is not None]
    return {"modes": modes, "known": len(known), "syncs": len(engine.predictions)}


def check_cost_decides() -> dict[str, dict[str, int]]:
    """Latency-bound links pick dense syncs; byte-bound links pick touched rows."""
    out = {}
    cases = {
        "latency": LinkCosts(1.0, 1e-12, 1e-12, 1e-12, 0.0),
        "bytes": LinkCosts(0.0, 1e-3, 1e-6, 1e-6, 0.0),
    }
    for name, costs in cases.items():
        model = _model(TABLES, "rowwise_adagrad")
        engine = AutoEngine(model.shard_states, model.replica_pg, costs=costs)
        policy = _policy(model, 1, engine)
        train(model, TABLES, 5, after_step=policy.step)
        _assert_replicas_equal(model)
        engine.close()
        chooser = engine.chooser
        out[name] = {**engine.counts, "home": chooser.home, "explored": chooser.explored}
    return out


def check_probe_and_decisions_agree() -> None:
    """The measured constants and every sync's mode are the same on all replicas."""
    model = _model(TABLES, "rowwise_adagrad")
    pg = model.replica_pg
    costs = probe(pg, torch.device("cpu"))
    every: list[LinkCosts | None] = [None] * dist.get_world_size(pg)
    dist.all_gather_object(every, costs, group=pg)
    assert all(c == costs for c in every), every
    assert costs.latency_s > 0 and costs.copy_s_per_byte > 0, costs
    options = SyncOptions(every=1, engine="auto", hide=False)  # replicas read right after
    policy = SyncPolicy(model.shard_states, pg, model.num_replicas, options)
    engine = policy.engine
    assert isinstance(engine, AutoEngine)
    modes: list[tuple[str, str, float | None, float | None]] = []

    def after(step: int) -> None:
        policy.step(step)
        chooser = engine.chooser
        modes.append((engine.mode, chooser.home, *(f is not None for f in chooser.fits.values())))

    train(model, TABLES, 12, after_step=after)
    assert any(modes[-1][2:]), modes  # measured times refined the model
    gathered = _modes(pg, modes)  # type: ignore[arg-type]
    assert all(m == gathered[0] for m in gathered), gathered
    _assert_replicas_equal(model)
    engine.close()


def check_tracking_pauses_while_dense_stays_home() -> dict:
    """Latency-bound links keep dense home: lookups go unstamped but in the interval before a
    sampled sync, the samples still count only that interval's rows, and the values stay the
    dense engine's to the bit."""
    dense, auto = _model(TABLES, "rowwise_adagrad"), _model(TABLES, "rowwise_adagrad")
    costs = LinkCosts(1.0, 1e-12, 1e-12, 1e-12, 0.0)
    engine = AutoEngine(auto.shard_states, auto.replica_pg, costs=costs)
    dense_policy = _policy(dense, 1, DenseEngine(dense.shard_states, dense.replica_pg))
    auto_policy = _policy(auto, 1, engine)
    paused: list[bool] = []

    def auto_step(step: int) -> None:
        auto_policy.step(step)
        paused.append(engine.tracker.paused)

    train(dense, TABLES, 40, after_step=dense_policy.step)
    train(auto, TABLES, 40, after_step=auto_step)
    _assert_same(dense, auto)
    _assert_replicas_equal(auto)
    fractions = [
        engine._union[(i, kind)] / rows  # noqa: SLF001 (the estimate the samples fed)
        for i, kind, rows, _ in engine._entries(["weights", "states"])  # noqa: SLF001
        if rows
    ]
    engine.close()
    return {"paused": paused, "home": engine.chooser.home, "least": min(fractions)}


# ---- tests -------------------------------------------------------------------------------
@pytest.mark.parametrize("every", [1, 2])
def test_switching_modes_bit_identical_to_dense(world4, every: int) -> None:
    for r in world4.run(check_switching_is_bit_identical, every):
        assert set(r["modes"]) == {DENSE, SPARSE}, r
        assert r["known"] == r["syncs"] - 1, r  # unions known after the first sync


def test_cost_model_picks_the_cheaper_mode(world4) -> None:
    for r in world4.run(check_cost_decides):
        latency, nbytes = r["latency"], r["bytes"]
        assert latency["home"] == DENSE and nbytes["home"] == SPARSE, r
        # touched rows first (learn the unions), then at most one exploration in 5 syncs
        assert latency[SPARSE] == 1 + latency["explored"] and latency["explored"] <= 1, r
        assert nbytes[DENSE] == 0, r  # dense is predicted far dearer: never even tried


def test_probe_and_decisions_agree_across_replicas(world4) -> None:
    world4.run(check_probe_and_decisions_agree)


def test_crossover_from_costs() -> None:
    assert LinkCosts(0, 1e-9, 1e-9, 3e-9, 0).crossover() == pytest.approx(0.5)
    assert LinkCosts(0, 1e-9, 1e-9, 1e-9, 0).crossover() == 1.0
    assert LinkCosts(0, 0, 0, 0, 0).crossover() == 1.0


def test_tracking_pauses_while_dense_stays_home(world4) -> None:
    for r in world4.run(check_tracking_pauses_while_dense_stays_home):
        assert r["home"] == DENSE, r
        tail = r["paused"][10:]  # once dense is home and both modes were measured
        assert sum(tail) >= len(tail) // 2, r["paused"]
        # a sample counts one interval's rows, not the rows marked when tracking resumed
        assert r["least"] < 0.5, r
