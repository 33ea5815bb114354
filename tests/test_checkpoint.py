"""Checkpoints: exact round trips across (world, group size, plan), validation, atomicity.

Checkpoints are saved by the 4-rank world at L=2 and loaded by the 4-rank world at
L=2 and L=4 and by the 2-rank world at L=1 and L=2. A world-2 rank trains on the
concatenated batches of two world-4 ranks, so the global batch (and, with exact
SGD and a sync every step, the whole trajectory) is the same in both worlds.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist
from torchrec import KeyedJaggedTensor
from torchrec.optim import RowWiseAdagrad
from torchrec.optim.optimizers import in_backward_optimizer_filter

from sparse2d import DMPCollection
from sparse2d.checkpoint import CheckpointError, latest, list_checkpoints, load, save
from tests.models import (
    MIXED_TABLES,
    Table,
    build_model,
    constraints_for,
    make_batch,
    rank_device,
)

SAVE_AT = 3
STEPS = 6
OPTIMIZERS = {"sgd": torch.optim.SGD, "adagrad": RowWiseAdagrad}


def _model(tables: tuple[Table, ...], group: int, opt: str, seed: int) -> DMPCollection:
    module = build_model(tables, optimizer=OPTIMIZERS[opt], lr=0.1, seed=seed)
    return DMPCollection(module, group, device=rank_device(), constraints=constraints_for(tables))


def _dense_opt(model: DMPCollection) -> torch.optim.Optimizer:
    params = [p for _, p in in_backward_optimizer_filter(model.named_parameters())]
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def _batch(step: int) -> tuple[KeyedJaggedTensor, torch.Tensor, torch.Tensor]:
    """World-size independent data: world-W rank r trains on world-4 ranks r*4/W ... ."""
    factor = 4 // dist.get_world_size()
    parts = [make_batch(MIXED_TABLES, step, dist.get_rank() * factor + k) for k in range(factor)]
    keys = parts[0][0].keys()
    lengths = [p[0][k].lengths() for k in keys for p in parts]
    values = [p[0][k].values() for k in keys for p in parts]
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=keys, values=torch.cat(values), lengths=torch.cat(lengths)
    )
    return kjt, torch.cat([p[1] for p in parts]), torch.cat([p[2] for p in parts])


def _train(model: DMPCollection, opt: torch.optim.Optimizer, steps: range) -> list[float]:
    losses = []
    for step in steps:
        kjt, dense, target = _batch(step)
        loss = ((model(kjt, dense) - target) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        model.sync()
        value = loss.detach().clone()
        dist.all_reduce(value, op=dist.ReduceOp.AVG)
        losses.append(float(value))
    return losses


def snapshot(model: DMPCollection, tables: tuple[Table, ...] = MIXED_TABLES) -> dict:
    """Full tables and per-column optimizer states of one sharding group, plus dense state."""
    out: dict[str, torch.Tensor] = {}
    for t in tables:
        out[t.name] = torch.zeros(t.rows, t.dim)
        out[f"{t.name}.state"] = torch.zeros(t.rows, t.dim)
    for s in model.shard_states:
        rows = slice(s.row_offset, s.row_offset + s.rows)
        cols = slice(s.col_offset, s.col_offset + s.cols)
        out[s.table][rows, cols] = s.weight.detach()
        for state in s.optimizer_states:
            value = state.detach()
            out[f"{s.table}.state"][rows, cols] = value[:, None] if value.dim() == 1 else value
    for key in sorted(out):
        dist.all_reduce(out[key], group=model.sharding_pg)
    for name, tensor in model.state_dict().items():
        if type(tensor) is torch.Tensor:
            out[f"dense.{name}"] = tensor.clone()
    return out


def _dense_momentum(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [opt.state[p]["momentum_buffer"].clone() for g in opt.param_groups for p in g["params"]]


# ---- worker-side checks ----------------------------------------------------------------
def check_save(path: str, opt_name: str) -> dict:
    """Train at (4, L=2), save at SAVE_AT, then continue uninterrupted to STEPS."""
    model = _model(MIXED_TABLES, 2, opt_name, seed=0)
    opt = _dense_opt(model)
    _train(model, opt, range(SAVE_AT))
    where = save(path, model, opt, extra={"step": SAVE_AT, "data_position": SAVE_AT * 8})
    rng_after_save = torch.rand(3)
    state = snapshot(model)
    momentum = _dense_momentum(opt)
    losses = _train(model, opt, range(SAVE_AT, STEPS))
    return {
        "where": where,
        "state": state,
        "momentum": momentum,
        "losses": losses,
        "rng": rng_after_save,
    }


def check_load(path: str, group: int, opt_name: str) -> dict:
    """Build a differently seeded model at (this world, ``group``), load, continue training."""
    model = _model(MIXED_TABLES, group, opt_name, seed=123)
    opt = _dense_opt(model)
    extra = load(path, model, opt)
    rng_after_load = torch.rand(3)
    state = snapshot(model)
    momentum = _dense_momentum(opt)
    losses = _train(model, opt, range(extra["step"], STEPS))
    return {
        "extra": extra,
        "state": state,
        "momentum": momentum,
        "losses": losses,
        "rng": rng_after_load,
    }


def check_rejects(path: str, tables: tuple[Table, ...], opt_name: str) -> tuple[str, bool]:
    """Loading a mismatched/corrupt checkpoint raises on this rank and modifies nothing."""
    model = _model(tables, dist.get_world_size(), opt_name, seed=7)
    before = snapshot(model, tables)
    try:
        load(path, model)
    except CheckpointError as error:
        message = str(error)
    else:
        message = ""
    after = snapshot(model, tables)
    unchanged = all(torch.equal(before[k], after[k]) for k in before)
    return message, unchanged


def check_load_big(path: str) -> tuple[int, list[float]]:
    """Load the killed worker's latest checkpoint (saved at world 1) at world 2, L=2."""
    model = _model(BIG_TABLES, 2, "sgd", seed=1)
    extra = load(path, model)
    values = {float(v) for s in model.shard_states if s.table == "b0" for v in s.weight.unique()}
    return extra["step"], sorted(values)


# ---- tests -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def saved(world4, tmp_path_factory) -> dict[str, tuple[str, dict]]:
    root = tmp_path_factory.mktemp("ckpt")
    out = {}
    for name in OPTIMIZERS:
        path = str(root / name)
        out[name] = (path, world4.run(check_save, path, name)[0])
    return out


def _assert_same_state(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=0, msg=key)


@pytest.mark.parametrize("opt_name", ["adagrad", "sgd"])
@pytest.mark.parametrize("group", [2, 4])
def test_round_trip_world4(world4, saved, opt_name: str, group: int) -> None:
    path, reference = saved[opt_name]
    assert os.path.basename(reference["where"]) == f"step_{SAVE_AT:08d}"
    results = world4.run(check_load, path, group, opt_name)
    for result in results:
        _assert_same_state(result["state"], reference["state"])
        assert result["extra"] == {"step": SAVE_AT, "data_position": SAVE_AT * 8}
    for got, want in zip(results[0]["momentum"], reference["momentum"], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(results[0]["rng"], reference["rng"], rtol=0, atol=0)
    if opt_name == "sgd" or group == 2:  # exact SGD with sync == 1D for any L
        torch.testing.assert_close(results[0]["losses"], reference["losses"], rtol=0, atol=1e-6)


@pytest.mark.parametrize("opt_name", ["adagrad", "sgd"])
@pytest.mark.parametrize("group", [1, 2])
def test_round_trip_world2(world2, saved, opt_name: str, group: int) -> None:
    path, reference = saved[opt_name]
    results = world2.run(check_load, path, group, opt_name)
    for result in results:
        _assert_same_state(result["state"], reference["state"])
    for got, want in zip(results[0]["momentum"], reference["momentum"], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    if opt_name == "sgd":  # same global batch, exact SGD: the uninterrupted trajectory
        torch.testing.assert_close(results[0]["losses"], reference["losses"], rtol=0, atol=1e-6)


def _expect_rejection(world2, path: str, tables, opt_name: str, *needles: str) -> None:
    for message, unchanged in world2.run(check_rejects, path, tables, opt_name):
        assert message, "load did not raise CheckpointError"
        assert unchanged, "weights were modified before the error"
        for needle in needles:
            assert needle in message, (needle, message)


def test_rejects_missing_table(world2, saved) -> None:
    path, _ = saved["sgd"]
    extra_table = (*MIXED_TABLES, Table("t9", 16, 8, "table_wise"))
    _expect_rejection(world2, path, extra_table, "sgd", "'t9'", path)


def test_rejects_wrong_shape(world2, saved) -> None:
    path, _ = saved["sgd"]
    tables = (Table("t0", 44, 8, "table_wise"), *MIXED_TABLES[1:])
    _expect_rejection(world2, path, tables, "sgd", "'t0'", "(44, 8)", path)


def test_rejects_other_optimizer(world2, saved) -> None:
    path, _ = saved["sgd"]
    _expect_rejection(world2, path, MIXED_TABLES, "adagrad", "optimizer states", path)


def test_rejects_truncated_file(world2, saved, tmp_path) -> None:
    source = latest(saved["adagrad"][0])
    broken = str(tmp_path / "broken")
    shutil.copytree(source, broken)
    biggest = max(
        (f for f in os.listdir(broken) if f.endswith(".distcp")),
        key=lambda f: os.path.getsize(os.path.join(broken, f)),
    )
    with open(os.path.join(broken, biggest), "r+b") as f:
        f.truncate(os.path.getsize(os.path.join(broken, biggest)) // 2)
    _expect_rejection(world2, broken, MIXED_TABLES, "adagrad", "truncated", "table '", broken)


def test_rejects_incomplete_directory(world2, saved, tmp_path) -> None:
    partial = str(tmp_path / "partial")
    shutil.copytree(latest(saved["sgd"][0]), partial)
    os.remove(os.path.join(partial, "COMPLETE.json"))
    _expect_rejection(world2, partial, MIXED_TABLES, "sgd", "no complete checkpoint", partial)


# ---- atomicity: SIGKILL a real process in the middle of a save ------------------------
BIG_TABLES = tuple(Table(f"b{i}", 16_384, 64, "table_wise") for i in range(4))


def _kill_worker(path: str) -> None:
    """Save forever (step i holds weights == i in table b0) until killed."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # no port
    model = _model(BIG_TABLES, 1, "sgd", seed=1)
    for step in range(10_000):
        with torch.no_grad():
            for s in model.shard_states:
                if s.table == "b0":
                    s.weight.fill_(step)
        save(path, model, extra={"step": step}, keep=2)
        print(f"saved {step}", flush=True)


def _partial_saves(path: str) -> list[str]:
    return (
        [n for n in os.listdir(path) if ".tmp-" in n and os.listdir(os.path.join(path, n))]
        if os.path.isdir(path)
        else []
    )


def _step(checkpoint: str) -> int:
    return int(os.path.basename(checkpoint)[len("step_") :])


@pytest.mark.slow
def test_killed_save_keeps_last_good_checkpoint(world2, tmp_path) -> None:
    path = str(tmp_path / "killed")
    for _attempt in range(5):
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.test_checkpoint", path],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            good = latest(path)
            # kill once >= 3 saves completed (so keep=2 has pruned) and another is in flight
            if good is not None and _step(good) >= 2 and _partial_saves(path):
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.005)
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL, proc.stdout.read().decode()[-3000:]
        if _partial_saves(path):
            break  # killed while a save was in flight (the case under test)
    partial = _partial_saves(path)
    assert partial, "never caught a save in flight"
    good = latest(path)
    assert good is not None and good in list_checkpoints(path)
    assert all(".tmp-" not in p for p in list_checkpoints(path))
    assert len(list_checkpoints(path)) <= 2  # keep=2
    with open(os.path.join(path, "latest")) as f:
        assert os.path.join(path, f.read().strip()) == good
    step = _step(good)
    results = world2.run(check_load_big, path)
    assert [r[0] for r in results] == [step, step]
    assert sorted({v for r in results for v in r[1]}) == [float(step)]  # b0 lives on one rank


if __name__ == "__main__":
    _kill_worker(sys.argv[1])
