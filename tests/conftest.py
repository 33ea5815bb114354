from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import DistWorld, thread_count

ROOT = Path(__file__).resolve().parents[1]

LEAK_BOUND = 6
"""Threads a module may leave behind in a shared worker (two gloo groups' worth); more
means some check created process groups that nothing released."""
PEAK_BOUND = 100
"""Threads a shared worker may hold at any sampled moment during a module."""


class ThreadSampler:
    """Samples the thread count of every shared worker twice a second, from the parent."""

    def __init__(self, period: float = 0.5) -> None:
        self.period = period
        self.peak = 0  # over the whole session
        self.module_peak = 0  # since the current module started
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="thread-sampler")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            counts = [thread_count(pid) for world in DistWorld.live for pid in world.pids]
            if counts:
                self.samples += 1
                self.peak = max(self.peak, *counts)
                self.module_peak = max(self.module_peak, *counts)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


SAMPLER: ThreadSampler | None = None

HEAVY_FIRST = (
    "test_ft_launch.py",
    "test_train.py",
    "test_torchrec_2d_suite.py",
    "test_launch.py",
    "test_compatibility.py",
    "test_train_ft_mode.py",
    "test_dryrun.py",
    "test_emulated_hosts.py",
    "test_emulated_faults.py",
    "test_emulated_restart.py",
    "test_bench_chaos.py",
)
"""The modules with the most CPU seconds (fault-tolerant launches above all: 620 of the
suite's ~1740, 2026-11-27), collected first: ``make test`` runs the modules on two
pytest-xdist workers (``--dist loadfile --no-loadscope-reorder``) in collection order, so the
longest start while the other worker takes the many short ones, and none of them is left to
run alone at the end."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(HEAVY_FIRST)))  # stable


def pytest_sessionstart(session: pytest.Session) -> None:
    global SAMPLER
    SAMPLER = ThreadSampler()


XDIST_SAMPLES: list[tuple[int, int]] = []
"""(peak threads, samples) of each pytest-xdist worker's sampler, gathered by the controller."""


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if SAMPLER is not None and workeroutput is not None:  # an xdist worker: report upward
        SAMPLER.stop()
        workeroutput["thread_peak"], workeroutput["thread_samples"] = SAMPLER.peak, SAMPLER.samples


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:  # type: ignore[no-untyped-def]
    output = getattr(node, "workeroutput", {})
    XDIST_SAMPLES.append((output.get("thread_peak", 0), output.get("thread_samples", 0)))


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # type: ignore[no-untyped-def]
    if SAMPLER is None:
        return
    SAMPLER.stop()
    peak = max([SAMPLER.peak, *(p for p, _ in XDIST_SAMPLES)])
    samples = SAMPLER.samples + sum(n for _, n in XDIST_SAMPLES)
    line = f"shared workers: peak {peak} threads over {samples} samples"
    terminalreporter.write_line(line)
    path = os.environ.get("SPARSE2D_THREAD_LOG")
    if path:
        with open(path, "w") as out:
            json.dump({"peak_threads": peak, "samples": samples}, out)


def _grown(world: DistWorld, start: list[int]) -> int:
    return max(after - begin for after, begin in zip(world.threads, start))


def _check_released(what: str, before: dict[int, list[int]]) -> None:
    for world in DistWorld.live:
        start = before.get(id(world), world.baseline)
        if _grown(world, start) > LEAK_BOUND:
            names = world.thread_names()
            groups = _live_groups(world)
            pytest.fail(
                f"{what} left threads behind in the {world.world_size}-rank workers: "
                f"{start} -> {world.threads} (bound +{LEAK_BOUND}); some check created "
                "process groups (or threads) that were not released. Threads by name: "
                + "; ".join(f"rank {rank}: {counts}" for rank, counts in enumerate(names))
                + ". Live process groups: "
                + "; ".join(f"rank {rank}: {g}" for rank, g in enumerate(groups)),
                pytrace=False,
            )


def _live_groups(world: DistWorld) -> list[Any]:
    """Each rank's live process groups and where each was made (``harness.live_groups``),
    or why they could not be read."""
    from tests.harness import live_groups

    try:
        return world.run(live_groups, timeout=30.0)
    except Exception as error:  # the report must not hide the leak it reports
        return [f"unreadable: {type(error).__name__}: {error}"] * world.world_size


@pytest.fixture(scope="module", autouse=True)
def module_releases_threads(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each module, every shared worker is back within ``LEAK_BOUND`` threads of
    where it started, and no sample during the module exceeded ``PEAK_BOUND``."""
    before = {id(w): list(w.threads) for w in DistWorld.live}
    if SAMPLER is not None:
        SAMPLER.module_peak = 0
    yield
    _check_released(request.module.__name__, before)
    if SAMPLER is not None and SAMPLER.module_peak > PEAK_BOUND:
        pytest.fail(
            f"{request.module.__name__}: a shared worker held {SAMPLER.module_peak} threads "
            f"(bound {PEAK_BOUND})",
            pytrace=False,
        )


@pytest.fixture(autouse=True)
def test_releases_threads(request: pytest.FixtureRequest) -> Iterator[None]:
    """The same per test, so a leak names the test that made it."""
    before = {id(w): list(w.threads) for w in DistWorld.live}
    yield
    _check_released(request.node.nodeid, before)


@pytest.fixture(scope="session")
def world2() -> Iterator[DistWorld]:
    world = DistWorld(2)
    yield world
    world.close()


@pytest.fixture(scope="session")
def world4() -> Iterator[DistWorld]:
    world = DistWorld(4)
    yield world
    world.close()


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory: pytest.TempPathFactory, world2: DistWorld) -> dict[str, Path]:
    """Two tiny real trainer runs on the 2 shared gloo ranks, shared by the observability
    tests: ``2d`` (L=1, 2 replicas, TensorBoard on, divergence logged every 2nd sync) and
    ``1d`` (L=2, TensorBoard off). 6 steps, logs at 2/4/6, evals at 3/6."""
    from tests import trainer_world

    root = tmp_path_factory.mktemp("tiny_runs")
    runs = {"2d": root / "tiny_2d", "1d": root / "tiny_1d"}
    common = [
        "train.steps=6",
        "train.log_every=2",
        "train.eval_every=3",
        "train.eval_batches=2",
        "data.batch_size_per_rank=32",
    ]
    extra = {
        "2d": ["parallel.sharding_group_size=1", "parallel.sync.divergence_every=2"],
        "1d": ["parallel.sharding_group_size=2", "metrics.tensorboard=false"],
    }
    for name, run_dir in runs.items():
        trainer_world.train(world2, f"run_dir={run_dir}", *common, *extra[name])
    return runs
