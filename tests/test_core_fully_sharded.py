"""FULLY_SHARDED 2D against TorchRec 1D DMP and DEFAULT 2D, with its memory measured."""

from __future__ import annotations

import math
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torchrec.distributed.types import ShardingStrategy
from torchrec.optim import RowWiseAdagrad
from torchrec.optim.optimizers import in_backward_optimizer_filter

from sparse2d import ConfigError, DMPCollection, SyncError
from sparse2d.checkpoint import load, save
from sparse2d.core.fully_sharded import materialized
from sparse2d.sync.options import SyncOptions
from tests.models import (
    SEQUENCE_TABLES,
    Table,
    build_model,
    constraints_for,
    full_weights,
    gather_tables,
    load_full_weights,
    make_batch,
    replica_max_diff,
    shard_1d,
)
from tests.state_views import flat_state, tbe_weight_bytes
from tests.test_checkpoint import snapshot

STEPS = 6
FS = ShardingStrategy.FULLY_SHARDED
THREE_TYPES = (  # for L=1: TorchRec's TWRW sharding fails on a one-rank group (DEFAULT too)
    Table("a0", 37, 8, "table_wise"),
    Table("a1", 48, 12, "column_wise"),
    Table("a2", 61, 8, "row_wise"),
)
FOUR_TYPES = (  # TW, CW, RW, TWRW; odd sizes so the 1/G slices need padding
    Table("a0", 37, 8, "table_wise"),
    Table("a1", 48, 12, "column_wise"),
    Table("a2", 61, 8, "row_wise"),
    Table("a3", 45, 8, "table_row_wise"),
)


def _fs_model(tables, group, layout="intra_host", kind="pooled", optimizer=torch.optim.SGD, **kw):
    module = build_model(tables, kind, optimizer=optimizer, lr=kw.pop("lr", 2.0))
    return DMPCollection(
        module,
        group,
        device="cpu",
        constraints=constraints_for(tables),
        replica_layout=layout,
        node_group_size=min(group, 2),
        **kw,
    )


def _full_weight_bytes(model: DMPCollection) -> int:
    return sum(s.weight.numel() * s.weight.element_size() for s in model.shard_states)


def _train(model, tables, steps, seed=0, window=None, after=None, nan_rank=-1) -> list[float]:
    """The tests/models.train loop, with a probe in the forward->backward window."""
    params = [p for _, p in in_backward_optimizer_filter(model.named_parameters())]
    dense_opt = torch.optim.SGD(params, lr=0.1)
    losses = []
    for step in range(steps):
        kjt, dense, target = make_batch(tables, step, dist.get_rank(), seed=seed)
        if dist.get_rank() == nan_rank:  # a bad input row: NaN gradients on this rank
            dense[0, 0] = math.nan
        loss = ((model(kjt, dense) - target) ** 2).mean()
        if window is not None:
            window(step)
        loss.backward()
        dense_opt.step()
        dense_opt.zero_grad()
        losses.append(float(loss.detach()))
        if after is not None:
            after(step)
    return losses


def check_fully_sharded_equals_1d(group: int, layout: str, kind: str, tables) -> dict:
    weights = full_weights(build_model(tables, kind, lr=2.0))
    reference = shard_1d(build_model(tables, kind, lr=2.0), tables)
    load_full_weights(reference, weights)
    model = _fs_model(tables, group, layout, kind, sharding_strategy=FS)
    with materialized(model):
        load_full_weights(model, weights)
    full = _full_weight_bytes(model)
    resident: list[int] = []  # TBE storage + slices, at rest and in the fwd->bwd window
    probe = lambda _: resident.append(model.fully_sharded.resident_bytes())  # noqa: E731
    storage: list[int] = []
    reports = []
    ref_losses = _train(reference, tables, STEPS)
    losses = _train(
        model,
        tables,
        STEPS,
        window=lambda s: (probe(s), storage.append(tbe_weight_bytes(model))),
        after=lambda s: (
            probe(s),
            storage.append(tbe_weight_bytes(model)),
            reports.append(model.maybe_sync(s).bytes),
        ),
    )
    expected = gather_tables(reference, tables, None)
    with materialized(model):
        got = gather_tables(model, tables, model.sharding_pg)
        replicas = replica_max_diff(model, model.replica_pg)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), atol=1e-5, rtol=0)
    moved = max(float((expected[n] - weights[n]).abs().max()) for n in weights)
    return {
        "moved": moved,
        "replicas": replicas,
        "full": full,
        "resident": resident,
        "storage": storage,
        "reports": reports,
        "after": tbe_weight_bytes(model),
        "G": model.num_replicas,
    }


def _check_small(results: list[dict]) -> None:
    for r in results:
        assert r["moved"] > 1e-3, r["moved"]
        assert r["replicas"] == 0.0
        assert r["storage"] == [0] * (2 * STEPS) and r["after"] == 0  # TBE storage freed
        # The slices: 1/G of the weights plus at most G-1 padding elements per TBE.
        limit = r["full"] / r["G"] + 64 * r["G"]
        assert all(0 < b <= limit for b in r["resident"]), (r["resident"], limit)
        # Each step's reduce-scatter covered the whole (padded) weight buffer.
        assert all(b >= r["full"] for b in r["reports"]), r["reports"]


@pytest.mark.parametrize("group", [2, 1])
def test_fully_sharded_equals_1d_every_type(world4, group: int) -> None:
    tables = FOUR_TYPES if group > 1 else THREE_TYPES
    results = world4.run(check_fully_sharded_equals_1d, group, "intra_host", "pooled", tables)
    _check_small(results)
    assert {r["G"] for r in results} == {4 // group}


def test_fully_sharded_equals_1d_inter_host(world4) -> None:
    # No TWRW here: TorchRec 1.8 caches its 2D intra/cross-node groups per process
    # (comm._INTRA_PG_2D), so a TWRW table in a second layout reuses the first one's groups.
    results = world4.run(check_fully_sharded_equals_1d, 2, "inter_host", "pooled", THREE_TYPES)
    _check_small(results)


def test_fully_sharded_sequence_equals_1d(world4) -> None:
    results = world4.run(
        check_fully_sharded_equals_1d, 2, "intra_host", "sequence", SEQUENCE_TABLES
    )
    _check_small(results)


def check_adagrad_matches_default(group: int) -> dict:
    """Row-wise AdaGrad: FULLY_SHARDED equals DEFAULT with sync() after every step,
    weights and accumulators."""
    tables = FOUR_TYPES if group > 1 else THREE_TYPES
    runs = {}
    # FULLY_SHARDED with the options its check accepts though they do not apply (the
    # trainer's defaults): the same values, so accepting them is harmless
    ignored = SyncOptions(engine="auto", hide=True, divergence_every=1)
    for strategy in (ShardingStrategy.DEFAULT, FS):
        model = _fs_model(
            tables,
            group,
            optimizer=RowWiseAdagrad,
            lr=0.5,
            sharding_strategy=strategy,
            sync_options=ignored if strategy == FS else None,
        )
        _train(model, tables, STEPS, after=lambda s, m=model: (m.maybe_sync(s), m.sync()))
        with materialized(model):
            runs[strategy] = (
                [s.weight.detach().clone() for s in model.shard_states],
                [t.detach().clone() for s in model.shard_states for t in s.optimizer_states],
                replica_max_diff(model, model.replica_pg),
            )
            if strategy == FS:
                gathered = model.fully_sharded.resident_bytes(weights=False, states=True)
    at_rest = model.fully_sharded.resident_bytes(weights=False, states=True)
    (w_ref, s_ref, _), (w_fs, s_fs, diff) = runs[ShardingStrategy.DEFAULT], runs[FS]
    for got, want in zip(w_fs + s_fs, w_ref + s_ref, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    return {"diff": diff, "states": len(s_fs), "gathered": gathered, "at_rest": at_rest}


@pytest.mark.parametrize("group", [2, 1])
def test_rowwise_adagrad_matches_default_sync_every_step(world4, group: int) -> None:
    for result in world4.run(check_adagrad_matches_default, group):
        assert result["diff"] == 0.0 and result["states"] > 0
        assert result["at_rest"] < result["gathered"]  # state is sharded too


def check_nan_refused() -> dict:
    """A NaN input on rank 1: every rank raises SyncError, no slice takes the NaN.

    Rank 1's NaN gradients reach the shard owners of its sharding group, so those
    kernels skip their reduce-scatter (on every replica); other kernels average as usual."""
    model = _fs_model(FOUR_TYPES, 2, lr=0.1, sharding_strategy=FS)
    _train(model, FOUR_TYPES, 1, after=model.maybe_sync)
    before = [s.shard.clone() for k in model.fully_sharded.kernels for s in [k.weights]]
    message = ""
    try:
        _train(model, FOUR_TYPES, 1, after=model.maybe_sync, nan_rank=1)
    except SyncError as error:
        message = str(error)
    kernels = model.fully_sharded.kernels
    poisoned = [k.poisoned for k in kernels]
    kept = [torch.equal(b, k.weights.shard) for b, k in zip(before, kernels, strict=True)]
    unchanged = all(keep for keep, bad in zip(kept, poisoned, strict=True) if bad)
    return {"message": message, "unchanged": unchanged, "poisoned": sum(poisoned)}


def test_nan_raises_on_every_rank_and_poisons_nothing(world4) -> None:
    results = world4.run(check_nan_refused)
    for r in results:
        assert "non-finite" in r["message"] and "rank(s) [1" in r["message"], r["message"]
    # The replica groups that met the NaN skipped their reduce-scatter: no slice took it.
    assert all(r["unchanged"] for r in results)
    assert sum(r["poisoned"] for r in results) > 0


_COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_gather_object",
)


@contextmanager
def _collectives() -> Iterator[Counter]:
    """The ``torch.distributed`` collectives the FULLY_SHARDED schedule calls while inside,
    by name, its votes through ``sparse2d.sync.ballot`` included (not TorchRec's output
    dists, nor the policy's or DDP's)."""
    counts: Counter = Counter()
    originals = {name: getattr(dist, name) for name in _COLLECTIVES}

    def counting(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            frame, callers = sys._getframe(1), []
            while frame is not None and len(callers) < 3:  # the caller, or the ballot's
                callers.append(frame.f_globals["__name__"])
                frame = frame.f_back
            if any(c.startswith("sparse2d.core.fully_sharded") for c in callers):
                counts[name] += 1
            return originals[name](*args, **kwargs)

        return call

    for name in _COLLECTIVES:
        setattr(dist, name, counting(name))
    try:
        yield counts
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)


def check_collectives_per_step() -> dict:
    """What a step, its sync check, a settle after replicas wrote different values and a
    NaN step with its check each cost in collectives (the votes are one all-reduce each)."""
    model = _fs_model(FOUR_TYPES, 2, optimizer=RowWiseAdagrad, lr=0.1, sharding_strategy=FS)
    fs = model.fully_sharded
    _train(model, FOUR_TYPES, 1)
    with _collectives() as step:
        _train(model, FOUR_TYPES, 1)
    with _collectives() as sync:
        fs.report(1)
    with _collectives() as settle, materialized(model), torch.no_grad():
        fs.kernels[0].weights._padded_view()[:1] += dist.get_rank() + 1  # replicas differ
    with _collectives() as nan_step:
        _train(model, FOUR_TYPES, 1, nan_rank=1)
    with _collectives() as nan_sync:
        try:
            fs.report(3)
        except SyncError:
            pass
    return {
        "kernels": len(fs.kernels),
        "buffers": sum(len(k.buffers) for k in fs.kernels),
        "poisoned": sum(len(k.buffers) for k in fs.kernels if k.poisoned),
        **{
            name: dict(counts)
            for name, counts in [
                ("step", step),
                ("sync", sync),
                ("settle", settle),
                ("nan_step", nan_step),
                ("nan_sync", nan_sync),
            ]
        },
    }


def test_votes_add_no_collective(world4) -> None:
    for r in world4.run(check_collectives_per_step):
        kernels, buffers = r["kernels"], r["buffers"]
        # _train's named_parameters materializes (every buffer back, one "written" vote per
        # kernel at the forward's settle); forward gathers the weights, backward weights and
        # states; one finite vote per kernel; a reduce-scatter per buffer
        step = {"all_gather_into_tensor": kernels + 2 * buffers, "all_reduce": 2 * kernels}
        assert r["step"] == {**step, "reduce_scatter_tensor": buffers}, r
        assert r["sync"] == {"all_reduce": 1}, r  # the job-wide NaN/inf vote
        # every buffer back; per kernel one "written" vote; the written weights compared
        # (broadcast + one "same" vote) and averaged
        assert r["settle"] == {
            "all_gather_into_tensor": buffers,
            "all_reduce": kernels + 1,
            "broadcast": 1,
            "reduce_scatter_tensor": 1,
        }, r
        assert r["nan_step"] == {**step, "reduce_scatter_tensor": buffers - r["poisoned"]}, r
        assert r["nan_sync"] == {"all_reduce": 1, "all_gather_object": 1}, r


def check_repair_refused() -> str:
    model = _fs_model(FOUR_TYPES, 2, sharding_strategy=FS)
    try:
        model.repair_from_replicas([1])
    except ConfigError as error:
        return str(error)
    return ""


def test_repair_is_refused_with_a_clear_error(world4) -> None:
    for message in world4.run(check_repair_refused):
        assert "FULLY_SHARDED" in message and "checkpoint" in message


def _snapshot(model: DMPCollection) -> dict[str, torch.Tensor]:
    with materialized(model):
        return snapshot(model, FOUR_TYPES)


def check_checkpoint_reshards(path: str) -> dict:
    """FULLY_SHARDED -> DEFAULT -> FULLY_SHARDED through checkpoints (row-wise AdaGrad):
    what is loaded equals what was saved, and training continues identically."""
    adagrad = {"optimizer": RowWiseAdagrad, "lr": 0.5}
    saved = _fs_model(FOUR_TYPES, 2, sharding_strategy=FS, **adagrad)
    _train(saved, FOUR_TYPES, 3, after=saved.maybe_sync)
    save(f"{path}/a", saved, extra={"step": 3})
    at_save = _snapshot(saved)
    default = _fs_model(FOUR_TYPES, 2, **adagrad)
    load(f"{path}/a", default)
    loaded = _snapshot(default)
    wide = _fs_model(FOUR_TYPES, 4, **adagrad)  # one replica: FULLY_SHARDED is a no-op
    load(f"{path}/a", wide)
    loaded_wide = _snapshot(wide)
    _train(saved, FOUR_TYPES, 2, seed=1, after=saved.maybe_sync)
    _train(default, FOUR_TYPES, 2, seed=1, after=lambda _: default.sync())
    save(f"{path}/b", default, extra={"step": 5})
    back = _fs_model(FOUR_TYPES, 2, sharding_strategy=FS, **adagrad)
    load(f"{path}/b", back)
    out = {"continued": (_snapshot(saved), _snapshot(default)), "back": _snapshot(back)}
    out["storage"] = tbe_weight_bytes(back)  # a load leaves the buffers at rest
    return {"at_save": at_save, "loaded": loaded, "loaded_wide": loaded_wide, **out}


def test_checkpoint_reshards_between_default_and_fully_sharded(world4, tmp_path) -> None:
    for r in world4.run(check_checkpoint_reshards, str(tmp_path)):
        keys = [k for k in r["at_save"] if not k.startswith("dense.")]
        assert any(float(r["at_save"][f"{t.name}.state"].abs().max()) > 0 for t in FOUR_TYPES)
        for key in keys:
            torch.testing.assert_close(r["loaded"][key], r["at_save"][key], atol=0, rtol=0)
            torch.testing.assert_close(r["loaded_wide"][key], r["at_save"][key], atol=0, rtol=0)
            fs, default = (c[key] for c in r["continued"])
            torch.testing.assert_close(fs, default, atol=1e-5, rtol=0)
            torch.testing.assert_close(r["back"][key], default, atol=0, rtol=0)
        assert r["storage"] == 0


def check_mixed_contexts() -> dict:
    """DEFAULT EBC at L=2 next to a FULLY_SHARDED EC at L=1 (submodule_configs): like 1D."""
    from torchrec import EmbeddingCollection
    from torchrec.distributed.types import DMPCollectionConfig

    from tests import test_core_contexts as ctx

    unsharded = ctx.build()
    weights = {**full_weights(unsharded.pooled), **full_weights(unsharded.sequence)}
    reference = shard_1d(ctx.build(), ctx.ALL)
    load_full_weights(reference, weights)
    ref_losses = ctx.train(reference, sync=False)
    config = DMPCollectionConfig(
        module=EmbeddingCollection, plan=None, sharding_group_size=1, sharding_strategy=FS
    )
    model = DMPCollection(
        ctx.build(),
        2,
        device="cpu",
        constraints=constraints_for(ctx.ALL),
        submodule_configs=[config],
    )
    with materialized(model):
        load_full_weights(model, weights)
    losses = ctx.train(model, sync=True)
    sliced = {t for k in model.fully_sharded.kernels for t in k.tables}
    expected, _ = ctx.tables_and_coverage(reference)
    with materialized(model):
        got, _ = ctx.tables_and_coverage(model)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), atol=1e-5, rtol=0)
    storage = tbe_weight_bytes(model)
    with materialized(model):  # the library's access vs the user's surfaces at rest
        inside = flat_state(model.state_dict())
    outside = flat_state(model.state_dict())
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert inside.keys() == outside.keys() and len(params) > 0
    for key in inside:
        torch.testing.assert_close(outside[key], inside[key], atol=0, rtol=0)
    return {"sliced": sliced, "storage": storage}


@pytest.mark.slow
def test_fully_sharded_context_next_to_a_default_one(world4) -> None:
    results = world4.run(check_mixed_contexts, timeout=900)
    for r in results:
        assert r["sliced"] <= {t.name for t in SEQUENCE_TABLES}  # only the EC is sliced
        assert r["storage"] > 0  # the DEFAULT EBC keeps its full shards
    assert any(r["sliced"] for r in results)
