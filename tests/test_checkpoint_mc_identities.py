"""Checkpoints of managed-collision models: identity tables travel with their rows.

World 4 at L=2 trains an MCH and an MP-ZCH model (each replica inserts and evicts its own ids
between syncs) and saves. Loads at the same layout are compared buffer for buffer; resharded
loads by raw id (plain dicts built here from the live modules, not with sparse2d's code) and
through the model's own lookups; every load then continues training next to the run it came
from. A world-2 rank at L=1 trains on the batches of its world-4 sharding group at L=2 (ranks
g and g+2), so both layouts see the same data per replica.
"""

from __future__ import annotations

import hashlib
import math
import os
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torchrec import KeyedJaggedTensor
from torchrec.optim.optimizers import in_backward_optimizer_filter

from tests.harness import DistWorld
from tests.mc_models import DENSE, MC_TABLES, RAW_IDS, build_mc_model, mc_batch

SAVE_AT, MORE = 4, 3
ROOMY = (("m0", 408), ("m1", 416))
"""Slots for every raw id (400) in each shard at L=2 and at L=1: nothing is ever evicted, and
the tables start at zero (TorchRec 1.8 gives a row a new id takes ``init_fn`` values, random by
default), so training by id does not depend on the shard layout (the resharded-continuation
check)."""
VARIANTS = {"mch": ("mch", MC_TABLES), "zch": ("zch", MC_TABLES), "mch_roomy": ("mch", ROOMY)}


def _model(kind: str, group: int, seed: int, tables: tuple = MC_TABLES) -> Any:
    from torchrec.optim import RowWiseAdagrad

    from sparse2d import DMPCollection

    zeros = torch.nn.init.zeros_ if tables == ROOMY else None
    module = build_mc_model(
        False, optimizer=RowWiseAdagrad, lr=0.05, seed=seed, kind=kind, tables=tables, init_fn=zeros
    )
    model = DMPCollection(module, group, device="cpu")
    if tables == ROOMY:
        with torch.no_grad():
            for shard in model.shard_states:
                shard.weight.zero_()
    return model


def balanced_batch(step: int, rank: int) -> tuple[KeyedJaggedTensor, torch.Tensor, torch.Tensor]:
    """Two ids per sample and table, one from each half of the raw id space: every shard at
    L=2 (and L=1) gets the same number of ids each step, so TorchRec's MCH history buffer
    (sized by the first batch, dropping ids past it) never drops any in either layout."""
    gen = torch.Generator().manual_seed(step * 131 + rank + 17)
    half, batch = RAW_IDS // 2, 16
    values = []
    for _ in MC_TABLES:
        low = (half ** torch.rand(batch, generator=gen)).long() - 1
        high = half + (half ** torch.rand(batch, generator=gen)).long() - 1
        values.append(torch.stack([low, high], dim=1).reshape(-1))
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f_{n}" for n, _ in MC_TABLES],
        values=torch.cat(values),
        lengths=torch.full((batch * len(MC_TABLES),), 2),
    )
    return kjt, torch.randn(batch, DENSE, generator=gen), torch.randn(batch, generator=gen)


def _batch(step: int, variant: str) -> tuple[KeyedJaggedTensor, torch.Tensor, torch.Tensor]:
    """World 4: this rank's batch; world 2: those of world-4 ranks ``r`` and ``r + 2``."""
    rank = dist.get_rank()
    sources = [rank] if dist.get_world_size() == 4 else [rank, rank + 2]
    make = balanced_batch if variant == "mch_roomy" else mc_batch
    parts = [make(step, r) for r in sources]
    keys = parts[0][0].keys()
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=keys,
        values=torch.cat([p[0][k].values() for k in keys for p in parts]),
        lengths=torch.cat([p[0][k].lengths() for k in keys for p in parts]),
    )
    return kjt, torch.cat([p[1] for p in parts]), torch.cat([p[2] for p in parts])


def _train(model: Any, steps: range, variant: str) -> list[float]:
    params = [p for _, p in in_backward_optimizer_filter(model.named_parameters())]
    opt = torch.optim.SGD(params, lr=0.05)
    losses = []
    for step in steps:
        kjt, dense, target = _batch(step, variant)
        loss = ((model(kjt, dense) - target) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        model.sync()
        value = loss.detach().clone()
        dist.all_reduce(value, op=dist.ReduceOp.AVG)
        losses.append(float(value))
    return losses


# ---- views of the live model ------------------------------------------------------------
def _mc_modules(model: Any) -> dict[str, Any]:
    from torchrec.distributed.mc_modules import ShardedManagedCollisionCollection

    for sub in model.modules():
        if isinstance(sub, ShardedManagedCollisionCollection):
            return dict(sub._managed_collision_modules.items())
    raise AssertionError("no sharded managed-collision collection")


def by_id(model: Any) -> dict[str, dict[int, tuple]]:
    """``{table: {raw id: (weight row, state rows, metadata)}}`` over the sharding group."""
    from torchrec.modules.hash_mc_modules import HashZchManagedCollisionModule

    shards = {s.table: s for s in model.shard_states}
    local: dict[str, dict[int, tuple]] = {}
    for name, mc in _mc_modules(model).items():
        shard, entries = shards[name], {}
        if isinstance(mc, HashZchManagedCollisionModule):
            ids = mc._hash_zch_identities.detach().view(-1)
            rows = torch.arange(ids.numel())
            meta = [{"ttl": int(m)} for m in mc._hash_zch_metadata.view(-1)]
            valid = ids != -1
        else:
            ids = mc._mch_sorted_raw_ids
            rows = mc._mch_remapped_ids_mapping - int(mc._output_global_offset)
            keys = sorted(mc._mch_metadata)
            meta = [{k: int(getattr(mc, f"_mch_{k}")[i]) for k in keys} for i in range(ids.numel())]
            valid = ids != torch.iinfo(torch.int64).max
        for pos in torch.nonzero(valid).flatten().tolist():
            row = int(rows[pos])
            states = [s[row].clone() for s in shard.optimizer_states]
            entries[int(ids[pos])] = (shard.weight[row].clone(), states, meta[pos])
        local[name] = entries
    parts: list[Any] = [None] * dist.get_world_size(model.sharding_pg)
    dist.all_gather_object(parts, local, group=model.sharding_pg)
    return {name: {k: v for part in parts for k, v in part[name].items()} for name in local}


def buffers(model: Any) -> dict[str, torch.Tensor]:
    """Every buffer of this rank's MC modules, its iteration counters, rows and states."""
    out: dict[str, torch.Tensor] = {}
    for name, mc in _mc_modules(model).items():
        for key, value in mc.named_buffers():
            out[f"{name}.{key}"] = value.detach().clone()
        for key in ("_current_iter", "_last_eviction_iter"):
            if hasattr(mc, key):
                out[f"{name}.{key}"] = torch.tensor(getattr(mc, key))
    for s in model.shard_states:
        out[f"{s.table}.weight"] = s.weight.detach().clone()
        for i, state in enumerate(s.optimizer_states):
            out[f"{s.table}.state{i}"] = state.detach().clone()
    return out


def lookup(model: Any, ids: dict[str, list[int]]) -> dict[str, torch.Tensor]:
    """What the model's own MC-EC returns for raw ids (eval mode: nothing inserted)."""
    from torchrec.distributed.mc_embedding import ShardedManagedCollisionEmbeddingCollection

    sub = next(
        m for m in model.modules() if isinstance(m, ShardedManagedCollisionEmbeddingCollection)
    )
    names = [n for n, _ in MC_TABLES]
    batch = max(1, *(len(ids.get(n, [])) for n in names))
    lengths = [[1] * len(ids.get(n, [])) + [0] * (batch - len(ids.get(n, []))) for n in names]
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f_{n}" for n in names],
        values=torch.tensor([i for n in names for i in ids.get(n, [])], dtype=torch.int64),
        lengths=torch.tensor([x for part in lengths for x in part]),
    )
    model.eval()
    with torch.no_grad():
        embeddings, _ = sub(kjt)
    model.train()
    return {n: embeddings[f"f_{n}"].values().clone() for n in names}


def _outputs(model: Any) -> torch.Tensor:
    """The model's eval outputs on a fixed batch (known and unknown ids)."""
    kjt, dense, _ = mc_batch(999, dist.get_rank())
    model.eval()
    with torch.no_grad():
        out = model(kjt, dense).clone()
    model.train()
    return out


# ---- worker-side checks ------------------------------------------------------------------
def check_save(root: str) -> dict[str, dict[str, Any]]:
    """Train each variant at (4, L=2), save, record, continue as the uninterrupted reference;
    the MCH model also writes the naive every-replica copy (the dedup baseline)."""
    import torch.distributed.checkpoint as dcp

    from sparse2d.checkpoint import build_save_state, save

    out = {}
    for variant, (kind, tables) in VARIANTS.items():
        model = _model(kind, 2, seed=0, tables=tables)
        _train(model, range(SAVE_AT), variant)
        where = save(os.path.join(root, variant), model, step=SAVE_AT)
        if variant == "mch":
            naive = build_save_state(model, dedup=False)
            dcp.save(naive, storage_writer=dcp.FileSystemWriter(os.path.join(root, "naive")))
        record = {"where": where, "by_id": by_id(model), "buffers": buffers(model)}
        record["outputs"] = _outputs(model)
        record["losses"] = _train(model, range(SAVE_AT, SAVE_AT + MORE), variant)
        record["final"] = by_id(model)
        out[variant] = record
        model.close()
    return out


def check_load(path: str, variant: str, group: int) -> dict[str, Any]:
    """A differently seeded model at (this world, ``group``) loads, is read, trains on."""
    from sparse2d.checkpoint import load

    kind, tables = VARIANTS[variant]
    model = _model(kind, group, seed=5, tables=tables)
    extra = load(path, model)
    ids = by_id(model)
    result = {"extra": extra, "by_id": ids, "buffers": buffers(model), "outputs": _outputs(model)}
    result["lookup"] = lookup(model, {n: sorted(t) for n, t in ids.items()})
    result["losses"] = _train(model, range(SAVE_AT, SAVE_AT + MORE), variant)
    result["final"] = by_id(model)
    return result


# ---- tests -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def saved(world4: DistWorld, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = str(tmp_path_factory.mktemp("mc_ckpt"))
    records = world4.run(check_save, root)
    return {"root": root, "ranks": records}


def _assert_by_id(got: dict, want: dict, exact: bool = True) -> None:
    tolerance = {"rtol": 0, "atol": 0} if exact else {}
    assert sorted(got) == sorted(want)
    for table in want:
        assert sorted(got[table]) == sorted(want[table]), table
        for raw, (weight, states, meta) in want[table].items():
            g_weight, g_states, g_meta = got[table][raw]
            torch.testing.assert_close(g_weight, weight, **tolerance, msg=f"{table} id {raw}")
            for a, b in zip(g_states, states, strict=True):
                torch.testing.assert_close(a, b, **tolerance, msg=f"{table} id {raw} state")
            if exact:
                assert g_meta == meta, (table, raw, g_meta, meta)


def _assert_lookups_read_saved_rows(result: dict) -> None:
    for table, rows in result["lookup"].items():
        want = [result["by_id"][table][raw][0] for raw in sorted(result["by_id"][table])]
        torch.testing.assert_close(rows, torch.stack(want).reshape(rows.shape), rtol=0, atol=0)


@pytest.mark.parametrize("variant", ["mch", "zch"])
def test_same_layout_round_trip_is_exact(world4: DistWorld, saved: dict, variant: str) -> None:
    """(4, L=2) -> (4, L=2): every identity buffer, metadata, counter, row and optimizer state
    as saved; same outputs; training goes on exactly as the uninterrupted run."""
    reference = saved["ranks"]
    path = reference[0][variant]["where"]
    results = world4.run(check_load, path, variant, 2)
    for rank, result in enumerate(results):
        want = reference[rank][variant]
        assert sorted(result["buffers"]) == sorted(want["buffers"])
        for key, value in want["buffers"].items():
            torch.testing.assert_close(result["buffers"][key], value, rtol=0, atol=0, msg=key)
        torch.testing.assert_close(result["outputs"], want["outputs"], rtol=0, atol=0)
        _assert_by_id(result["by_id"], want["by_id"])
        _assert_lookups_read_saved_rows(result)
        torch.testing.assert_close(result["losses"], want["losses"], rtol=0, atol=1e-6)
        _assert_by_id(result["final"], want["final"], exact=False)


@pytest.mark.parametrize("variant", ["mch_roomy", "zch"])
def test_resharded_load_continues_like_the_run_it_came_from(
    world2: DistWorld, saved: dict, variant: str
) -> None:
    """(4, L=2) -> (2, L=1): one shard per table instead of two, the same 2 replicas. Every id
    keeps its row values, optimizer state and metadata, the model's own lookups read them,
    and training continues as the unresharded run did."""
    reference = saved["ranks"][0][variant]
    results = world2.run(check_load, reference["where"], variant, 1)
    for result in results:
        _assert_by_id(result["by_id"], reference["by_id"])
        _assert_lookups_read_saved_rows(result)
        torch.testing.assert_close(result["losses"], reference["losses"], rtol=0, atol=1e-5)
        _assert_by_id(result["final"], reference["final"], exact=False)


def _expected_survivors(saved: dict[int, tuple], shards: int, slots: int) -> set[int]:
    """Per new shard (raw id range of ``RAW_IDS / shards``), the ``slots - 1`` saved ids with
    the most counts (LFU; ties to the smaller id)."""
    block = math.ceil(RAW_IDS / shards)
    keep: set[int] = set()
    for k in range(shards):
        mine = sorted(raw for raw in saved if raw // block == k)
        best = sorted(mine, key=lambda raw: (-saved[raw][2]["counts"], raw))
        keep |= set(best[: slots - 1])
    return keep


def test_resharded_load_into_smaller_shards_keeps_the_best_ids(world4: DistWorld, saved) -> None:
    """(4, L=2) -> (4, L=4): four shards of a quarter of the rows each, and four sentinel rows
    instead of two, so not every saved id fits; each shard keeps those its eviction policy
    scores best, each with its saved values, where the model's lookups find them."""
    reference = saved["ranks"][0]["mch"]
    results = world4.run(check_load, reference["where"], "mch", 4)
    for table, slots in MC_TABLES:
        want = _expected_survivors(reference["by_id"][table], 4, slots // 4)
        got = results[0]["by_id"][table]
        assert set(got) == want, (table, sorted(got), sorted(want))
        assert len(got) < len(reference["by_id"][table])  # the case under test: a squeeze
        for raw in got:
            assert got[raw][2] == reference["by_id"][table][raw][2]
            torch.testing.assert_close(
                got[raw][0], reference["by_id"][table][raw][0], rtol=0, atol=0
            )
    for result in results:
        _assert_lookups_read_saved_rows(result)
        assert all(math.isfinite(x) for x in result["losses"])


def test_replicas_write_one_copy(saved: dict) -> None:
    """Only replica-rank 0 writes each shard's rows and identity table: every stored element
    of ``emb.*`` and ``mc.*`` exactly once, about half the bytes of every replica writing."""
    from torch.distributed.checkpoint import FileSystemReader

    path = saved["ranks"][0]["mch"]["where"]
    metadata = FileSystemReader(path).read_metadata()
    keys = [k for k in metadata.state_dict_metadata if k.startswith(("emb.", "mc."))]
    assert any(k.startswith("mc.m0.") for k in keys) and any(k.startswith("emb.m1") for k in keys)
    for key in keys:
        entry = metadata.state_dict_metadata[key]
        stored = sum(math.prod(chunk.sizes) for chunk in entry.chunks)
        assert stored == math.prod(entry.size), (key, stored, tuple(entry.size))

    def table_bytes(directory: str) -> int:
        data = FileSystemReader(directory).read_metadata().storage_data
        return sum(
            info.length
            for index, info in data.items()
            if ".emb." in f".{index.fqn}" or ".mc." in f".{index.fqn}"
        )

    ratio = table_bytes(path) / table_bytes(os.path.join(saved["root"], "naive"))
    assert ratio == pytest.approx(0.5, abs=0.02), ratio  # 2 replicas: one copy of two


MISMATCHES = {
    "names": ("mch", (("x0", 32), ("m1", 48)), ["'m0'", "mc.m0.ids", "lacks"]),
    "zch_size": ("mch", (("m0", 64), ("m1", 48)), ["zch_size=32", "zch_size=64", "mc.m0.ids"]),
    "kind": ("zch", MC_TABLES, ["MCHManagedCollisionModule", "HashZchManagedCollisionModule"]),
}


def check_refusals(path: str) -> list[tuple[str, bool]]:
    """Each mismatched model: ``load`` raises, the model is untouched, and rank 0 alone
    raises again (a collective reached before the check would hang it)."""
    from sparse2d.checkpoint import CheckpointError, load

    out = []
    for kind, tables, _ in MISMATCHES.values():
        model = _model(kind, 2, seed=3, tables=tables)
        before = buffers(model)
        messages = []
        for _attempt in range(2 if dist.get_rank() == 0 else 1):
            try:
                load(path, model)
            except CheckpointError as error:
                messages.append(str(error))
        after = buffers(model)
        untouched = all(torch.equal(before[k], after[k]) for k in before)
        out.append(
            (messages[0] if len(messages) == (2 if dist.get_rank() == 0 else 1) else "", untouched)
        )
        model.close()
    return out


def _digest(directory: str) -> dict[str, str]:
    return {
        f: hashlib.sha256(open(os.path.join(directory, f), "rb").read()).hexdigest()
        for f in sorted(os.listdir(directory))
    }


def test_mismatched_identity_tables_are_refused(world2: DistWorld, saved: dict) -> None:
    """Other MC table names, another zch_size, MP-ZCH for MCH: refused with the file and the
    key on every rank before any collective; model and checkpoint untouched."""
    path = saved["ranks"][0]["mch"]["where"]
    files = _digest(path)
    results = world2.run(check_refusals, path, timeout=120)
    for rank_results in results:
        for (message, untouched), (case, (_, _, needles)) in zip(
            rank_results, MISMATCHES.items(), strict=True
        ):
            assert message, (case, "load did not raise CheckpointError on every attempt")
            assert untouched, (case, "the model changed before the error")
            for needle in [path, "COMPLETE.json", *needles]:
                assert needle in message, (case, needle, message)
    assert _digest(path) == files
