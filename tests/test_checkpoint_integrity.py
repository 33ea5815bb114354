"""Checkpoint integrity on real gloo ranks and real files: checksums, failed saves, ``keep``."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal

import pytest
import torch
import torch.distributed as dist

from sparse2d.checkpoint import CheckpointError, latest, list_checkpoints, load, prune, save
from sparse2d.checkpoint.directory import LATEST, MARKER
from tests.models import MIXED_TABLES
from tests.test_checkpoint import _dense_opt, _model, _train, check_rejects, snapshot


# ---- worker-side checks ----------------------------------------------------------------
def check_save_twice(root: str) -> str:
    model = _model(MIXED_TABLES, 1, "adagrad", seed=0)
    opt = _dense_opt(model)
    _train(model, opt, range(2))
    save(root, model, opt, extra={"step": 2})
    _train(model, opt, range(2, 3))
    return save(root, model, opt, extra={"step": 3})


def check_failed_save(root: str, limit: int) -> dict:
    """Save step 1, then fail step 2 on rank 1 with a file-size limit (as a full disk does)."""
    model = _model(MIXED_TABLES, 1, "adagrad", seed=0)
    opt = _dense_opt(model)
    _train(model, opt, range(1))
    good = save(root, model, opt, extra={"step": 1})
    expected = snapshot(model)
    _train(model, opt, range(1, 2))
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
    message = ""
    try:
        if dist.get_rank() == 1:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
        save(root, model, opt, extra={"step": 2})
    except CheckpointError as error:
        message = str(error)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    dist.barrier()
    after = {"message": message, "latest": latest(root), "good": good, "entries": None}
    after["entries"] = sorted(os.listdir(root))
    fresh = _model(MIXED_TABLES, 1, "adagrad", seed=5)
    extra = load(root, fresh, _dense_opt(fresh))
    loaded = snapshot(fresh)
    after["step"] = extra["step"]
    after["restored"] = all(torch.equal(loaded[k], expected[k]) for k in expected)
    return after


# ---- fixtures and helpers ----------------------------------------------------------------
@pytest.fixture(scope="module")
def saved(world2, tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("integrity"))
    world2.run(check_save_twice, root)
    return latest(root)


def _copy(source: str, tmp_path, name: str = "copy") -> str:
    target = str(tmp_path / name)
    shutil.copytree(source, target)
    return target


def _flip(path: str, where: float = 0.5) -> None:
    with open(path, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(int(size * where))
        byte = f.read(1)
        f.seek(int(size * where))
        f.write(bytes([byte[0] ^ 0x01]))


def _rejected(world2, path: str, *needles: str) -> None:
    for message, unchanged in world2.run(check_rejects, path, MIXED_TABLES, "adagrad"):
        assert message, "load did not raise CheckpointError"
        assert unchanged, "weights changed before the error"
        for needle in needles:
            assert needle in message, (needle, message)


# ---- checksums -----------------------------------------------------------------------------
def test_marker_lists_every_file_with_size_and_sha256(saved) -> None:
    with open(os.path.join(saved, MARKER)) as f:
        files = json.load(f)["files"]
    on_disk = sorted(n for n in os.listdir(saved) if n != MARKER)
    assert sorted(files) == on_disk and ".metadata" in files
    for name, entry in files.items():
        assert entry["size"] == os.path.getsize(os.path.join(saved, name))
        assert len(entry["sha256"]) == 64


def test_flipped_byte_in_data_names_the_file(world2, saved, tmp_path) -> None:
    broken = _copy(saved, tmp_path)
    victim = max(
        (n for n in os.listdir(broken) if n.endswith(".distcp")),
        key=lambda n: os.path.getsize(os.path.join(broken, n)),
    )
    _flip(os.path.join(broken, victim))
    _rejected(world2, broken, f"{victim} does not match its sha256", "nothing was loaded")


def test_flipped_byte_in_metadata_names_the_file(world2, saved, tmp_path) -> None:
    broken = _copy(saved, tmp_path)
    _flip(os.path.join(broken, ".metadata"), where=0.9)
    _rejected(world2, broken, ".metadata does not match its sha256")


def test_truncated_file_names_the_file(world2, saved, tmp_path) -> None:
    broken = _copy(saved, tmp_path)
    victim = sorted(n for n in os.listdir(broken) if n.endswith(".distcp"))[0]
    with open(os.path.join(broken, victim), "r+b") as f:
        f.truncate(os.path.getsize(os.path.join(broken, victim)) - 1)
    _rejected(world2, broken, victim)


def test_missing_file_is_named(world2, saved, tmp_path) -> None:
    broken = _copy(saved, tmp_path)
    victim = sorted(n for n in os.listdir(broken) if n.endswith(".distcp"))[-1]
    os.remove(os.path.join(broken, victim))
    _rejected(world2, broken, victim)


def check_read_fails_on_rank_1(path: str) -> tuple[str, bool]:
    """DCP's read fails on rank 1 only, after its collectives: every rank raises, none
    changed a live value (the read vote)."""
    import sparse2d.checkpoint.dcp as ours

    original = ours.dcp.load

    def failing(*args: object, **kwargs: object) -> None:
        original(*args, **kwargs)
        raise OSError("disk went away")

    if dist.get_rank() == 1:
        ours.dcp.load = failing
    try:
        return check_rejects(path, MIXED_TABLES, "adagrad")
    finally:
        ours.dcp.load = original


def test_read_failing_on_one_rank_raises_on_every_rank(world2, saved) -> None:
    results = world2.run(check_read_fails_on_rank_1, saved)
    for rank, (message, unchanged) in enumerate(results):
        assert "reading failed, the model was not modified" in message, message
        assert ("disk went away" if rank == 1 else "another rank failed") in message, message
        assert unchanged


# ---- a save that fails -------------------------------------------------------------------
def test_failed_save_raises_everywhere_and_keeps_the_last_good(world2, tmp_path) -> None:
    root = str(tmp_path / "full")
    results = world2.run(check_failed_save, root, 512)
    for result in results:
        assert "failed on rank(s) [1]" in result["message"], result["message"]
        assert "File too large" in result["message"], result["message"]
        assert result["latest"] == result["good"]  # the pointer never moved
        assert result["entries"] == [LATEST, os.path.basename(result["good"])]  # no debris
        assert result["step"] == 1 and result["restored"]


# ---- keep=K (pure file system) -----------------------------------------------------------
def _fake(root, step: int, complete: bool = True) -> str:
    path = os.path.join(root, f"step_{step:08d}")
    os.makedirs(path)
    if complete:
        with open(os.path.join(path, MARKER), "w") as f:
            f.write("{}")
    return path


def _point(root, step: int) -> None:
    with open(os.path.join(root, LATEST), "w") as f:
        f.write(f"step_{step:08d}")


def test_keep_one_deletes_older_and_debris(tmp_path) -> None:
    for step in (10, 20, 30):
        _fake(tmp_path, step)
    os.makedirs(tmp_path / "step_00000040.tmp-dead")
    _point(tmp_path, 30)
    prune(tmp_path, 1)
    assert sorted(os.listdir(tmp_path)) == [LATEST, "step_00000030"]


def test_keep_never_deletes_the_pointed_or_the_newest(tmp_path) -> None:
    for step in (10, 20, 30):
        _fake(tmp_path, step)
    _point(tmp_path, 10)  # e.g. a run restarted from an older checkpoint
    prune(tmp_path, 1)
    assert sorted(os.listdir(tmp_path)) == [LATEST, "step_00000010", "step_00000030"]


def test_keep_ignores_an_incomplete_newest(tmp_path) -> None:
    _fake(tmp_path, 10)
    _fake(tmp_path, 20)
    _fake(tmp_path, 30, complete=False)  # no marker: never loaded, never counted
    assert latest(tmp_path) == str(tmp_path / "step_00000020")
    prune(tmp_path, 1)
    assert list_checkpoints(tmp_path) == [str(tmp_path / "step_00000020")]


def test_keep_more_than_exist_deletes_nothing(tmp_path) -> None:
    _fake(tmp_path, 10)
    _fake(tmp_path, 20)
    assert prune(tmp_path, 3) == []
    assert len(list_checkpoints(tmp_path)) == 2


@pytest.mark.parametrize("keep", [0, -1])
def test_keep_below_one_is_refused(tmp_path, keep: int) -> None:
    _fake(tmp_path, 10)
    with pytest.raises(CheckpointError, match=f"keep={keep} must be >= 1"):
        prune(tmp_path, keep)
    assert len(list_checkpoints(tmp_path)) == 1
