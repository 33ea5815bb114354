"""The whole emulated cluster lost during a checkpoint save, restarted on another shape.

2 hosts x 4 ranks (the cluster job's shape: ``configs/cluster_cpu.yaml``, L=4 inside each host,
small tables) save a checkpoint every 40 steps; once a later save is in flight (its
``step_N.tmp-*`` directory appeared) every process of every host, the launcher too, is
SIGKILLed at once. The job is launched again on 4 hosts x 2 ranks with another sharding group
size and layout (L=2, replicas inside a host) and ``train.resume=auto``: it must resume from
the last complete checkpoint, never read the half-written one, train to the end and match an
uninterrupted run's eval AUC. Root only (namespaces, tc): CI runs as root; elsewhere it skips.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparse2d.checkpoint import latest
from sparse2d.checkpoint.directory import MARKER, step_of
from tests.test_emulated_hosts import BASH, LAUNCHER, ROOT, _env, _left_behind, _remove_cluster

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="emulated hosts need root (ip netns, bridges, tc); CI runs as root"
)
STEPS = 160
EVERY = 40
JOB = (
    "model.tables=[{name: t, count: 4, rows: 500, dim: 16}]",
    "model.dense_arch=[64, 16]",
    "data.batch_size_per_rank=64",
    f"train.steps={STEPS}",
    "train.eval_batches=4",
    "train.log_every=10",
    "train.progress_bar=false",
    f"checkpoint.every={EVERY}",
)
"""The cluster job (its sync every 20 steps) made small; every launch of it the same job."""
FIRST = (
    {"HOSTS": "2", "NPROC": "4"},
    (
        "parallel.sharding_group_size=4",
        "parallel.replica_layout=inter_host",
    ),
)
SECOND = (
    {"HOSTS": "4", "NPROC": "2"},
    (
        "parallel.sharding_group_size=2",
        "parallel.replica_layout=intra_host",
    ),
)
OLD_ATIME = 1_000_000_000.0
"""The access time the half-written files are given after the kill (2001): a read moves it."""


@pytest.fixture
def cluster_id(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Every launch here carries this name (``CLUSTER_ID``); whatever happened, teardown runs
    ``launch/emulated_cleanup.sh NAME`` (a SIGKILLed launcher's trap never ran)."""
    name = hashlib.sha1(f"{ROOT}:{request.node.nodeid}".encode()).hexdigest()[:8]
    monkeypatch.setenv("CLUSTER_ID", name)
    yield name
    _remove_cluster(name)


def _launch(shape: tuple[dict, tuple], run_dir: Path, *args: str) -> subprocess.Popen:
    env, layout = shape
    out = open(run_dir.parent / f"{run_dir.name}.launcher.log", "w")  # noqa: SIM115
    with out:
        return subprocess.Popen(
            [BASH, str(LAUNCHER), *JOB, *layout, f"run_dir={run_dir}", *args],
            cwd=ROOT,
            env=_env(CONFIG="configs/cluster_cpu.yaml", LINK="1gbit", **env),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _said(run_dir: Path) -> str:
    return (run_dir.parent / f"{run_dir.name}.launcher.log").read_text()


def _cluster_pids(cluster_id: str) -> set[int]:
    """Every live process of the cluster: marked with its name (the launcher marks all it
    starts, itself included) or inside one of its hosts' network namespaces."""
    mark = f"SPARSE2D_EMULATED_CLUSTER={cluster_id}".encode()
    hosts = set()
    for ns in Path("/run/netns").glob(f"sparse2d-{cluster_id}-h*"):
        hosts.add(os.stat(ns).st_ino)
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            marked = mark in (proc / "environ").read_bytes().split(b"\0")
            inside = os.stat(proc / "ns" / "net").st_ino in hosts
        except OSError:  # gone, or a zombie
            continue
        if marked or inside:
            found.add(int(proc.name))
    return found


def _signal(pids: set[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def _freeze(cluster_id: str, known: set[int]) -> set[int]:
    """SIGSTOP every process of the cluster (those known first, then any found since) until a
    scan finds none left running; returns them."""
    stopped: set[int] = set()
    fresh = set(known)
    while fresh:
        _signal(fresh, signal.SIGSTOP)
        stopped |= fresh
        fresh = _cluster_pids(cluster_id) - stopped
    return stopped


def _kill_during_a_save(job: subprocess.Popen, checkpoints: Path, cluster_id: str) -> Path:
    """SIGKILL the whole cluster while a save after the first complete one is in flight.

    The event: a ``step_N.tmp-*`` directory newer than ``latest`` appears (DCP makes it at
    the save's start). Every process is stopped at once, and killed only if that save is
    still unpublished; had it finished meanwhile, all go on and the next save is the target.
    Returns the half-written directory."""
    pids: set[int] = set()
    deadline = time.monotonic() + 300
    while True:
        running = job.poll() is None and time.monotonic() < deadline
        assert running, (
            f"no save caught in flight (rc {job.returncode}): {_said(checkpoints.parent)[-3000:]}"
        )
        good = latest(checkpoints)
        if good is None:  # before the first complete checkpoint
            time.sleep(0.05)
            continue
        pids = pids or _cluster_pids(cluster_id)  # once: the cluster is training by now
        done = step_of(os.path.basename(good)) or 0
        names = os.listdir(checkpoints)
        flying = [n for n in names if (step_of(n.split(".tmp-")[0]) or 0) > done and ".tmp-" in n]
        if not flying:
            time.sleep(0.001)
            continue
        stopped = _freeze(cluster_id, pids)
        partial = checkpoints / flying[0]
        if partial.is_dir() and not (checkpoints / flying[0].split(".tmp-")[0]).exists():
            _signal(stopped, signal.SIGKILL)
            return partial
        _signal(stopped, signal.SIGCONT)  # that save completed first: aim at the next one


def _never_read_checker(partial: Path, keep: Path) -> dict[Path, tuple[int, int]] | None:
    """Hard links to the half-written files (they outlive its pruning) with their access time
    set back to 2001, so any later read moves it; ``None`` where this file system records no
    reads (noatime: a probe file's read left its access time)."""
    probe = keep / "probe"
    probe.write_bytes(b"x")
    os.utime(probe, (OLD_ATIME, time.time()))
    probe.read_bytes()
    if probe.stat().st_atime == OLD_ATIME:
        return None
    seen = {}
    for path in partial.rglob("*"):
        if path.is_file():
            link = keep / path.relative_to(partial).as_posix().replace("/", "__")
            os.link(path, link)
            os.utime(link, ns=(int(OLD_ATIME * 1e9), path.stat().st_mtime_ns))
            seen[link] = (link.stat().st_size, link.stat().st_mtime_ns)
    return seen


@pytest.mark.slow
def test_whole_cluster_lost_during_a_save_resumes_on_another_shape(
    tmp_path: Path, cluster_id: str
) -> None:
    """2 hosts x 4 ranks (L=4, each sharding group inside a host) killed whole mid-save, then
    4 hosts x 2 ranks (L=2, each replica group inside a host) with ``train.resume=auto``: it
    resumes from the last complete checkpoint, names the half-written one and never reads it
    (its files' access times stay put) until the next save prunes it, trains to the end and
    ends within 0.005 eval AUC of the job run uninterrupted; nothing of either is left."""
    run_dir, reference = tmp_path / "run", tmp_path / "uninterrupted"
    checkpoints = run_dir / "checkpoints"
    run_dir.mkdir()
    job = _launch(FIRST, run_dir, "train.resume=auto")
    try:
        partial = _kill_during_a_save(job, checkpoints, cluster_id)
        job.wait(timeout=30)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait(timeout=30)
    assert job.returncode == -signal.SIGKILL, job.returncode
    deadline = time.monotonic() + 60  # SIGKILLed processes leave once reaped
    while (alive := _cluster_pids(cluster_id)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive, alive
    left = [n.name for n in Path("/run/netns").glob(f"sparse2d-{cluster_id}-h*")]
    assert len(left) == 2, left  # no trap ran: the hosts stay until the next start
    # killed mid-save: the target step unpublished, ``latest`` on the previous checkpoint
    cut = step_of(partial.name.split(".tmp-")[0])
    resumable = latest(checkpoints)
    assert cut is not None and resumable is not None, (partial, resumable)
    assert step_of(os.path.basename(resumable)) == cut - EVERY, (partial, resumable)
    assert not (checkpoints / partial.name.split(".tmp-")[0]).exists()
    assert (Path(resumable) / MARKER).is_file()
    keep = tmp_path / "partial_files"
    keep.mkdir()
    watched = _never_read_checker(partial, keep)
    first_log = (run_dir / "host_0.log").read_text()  # the next start truncates it

    again = _launch(SECOND, run_dir, "train.resume=auto")
    assert again.wait(timeout=600) == 0, _said(run_dir)[-3000:]
    said = _said(run_dir)
    assert f"emulated cleanup: cluster {cluster_id}: removed" in said, said[-3000:]
    log = (run_dir / "host_0.log").read_text()
    resumed = re.findall(r"^\[resume\] (.*)$", log, re.M)
    assert resumed == [
        f"not read: {partial.name}, a save that never completed",
        f"{resumable}: step {cut - EVERY}",
    ], log[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["world_size"] == 8, summary
    assert (summary["sharding_group_size"], summary["num_replicas"]) == (2, 4), summary
    saved = [
        json.loads(line)["step"]
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if '"kind": "checkpoint"' in line
    ]
    # the first launch's saves, then the second's from the resumed step on (the cut one again)
    assert saved == [*range(EVERY, cut, EVERY), *range(cut, STEPS + 1, EVERY)], saved
    assert not partial.exists()  # removed by the second launch's first save (keep=2 prunes)
    if watched is not None:  # never read: no access since the kill, no byte changed
        now = {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in watched}
        assert now == watched and all(p.stat().st_atime == OLD_ATIME for p in watched), {
            p.name: p.stat().st_atime for p in watched
        }

    reference.mkdir()
    base = _launch(FIRST, reference)
    assert base.wait(timeout=600) == 0, _said(reference)[-3000:]
    want = json.loads((reference / "summary.json").read_text())["eval_auc"]
    got = summary["eval_auc"]
    print(f"resumed from step {cut - EVERY} (cut at {cut}): eval_auc {got:.4f} vs {want:.4f}")
    assert abs(got - want) <= 0.005, (got, want, first_log[-1000:])
    assert _left_behind(cluster_id, run_dir) == []
    shutil.rmtree(keep)
