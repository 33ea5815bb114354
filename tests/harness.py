"""A pool of forked processes joined in one gloo process group, reused by many checks.

Starting a rank and importing TorchRec costs seconds per process, so each world size
is started once per test session (forked from a forkserver that holds the imports:
``tests.worker_imports``) and checks are sent to it as functions. A
check that raises on any rank fails with every rank's traceback; a check that
does not finish within its timeout (a hang) fails and the pool is restarted.
"""

from __future__ import annotations

import datetime
import gc
import os
import queue
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp

ON_CUDA = os.environ.get("SPARSE2D_TEST_DEVICE", "cpu") == "cuda"  # tests.models.DEVICE
if ON_CUDA:
    # A fork of a process that touched the CUDA driver (importing FBGEMM's CUDA build
    # does) cannot use the GPU: each rank starts afresh.
    _CTX = mp.get_context("spawn")
else:
    _CTX = mp.get_context("forkserver")
    _CTX.set_forkserver_preload(["tests.worker_imports"])  # imported once, not once per rank


def own_store(rank: int, world_size: int, ports: Any, timeout: datetime.timedelta) -> Any:
    """A world's store, bound by its rank 0 on a port the kernel picks, so that no other
    process can take the port between a choice and the bind (a port picked by the parent and
    bound later by rank 0 is a race on a busy box); the port reaches the other ranks through
    the ``ports`` queue and ``MASTER_PORT``."""
    from torch.distributed import TCPStore

    if rank == 0:
        store = TCPStore("127.0.0.1", 0, world_size, True, timeout, wait_for_workers=False)
        for _ in range(world_size - 1):
            ports.put(store.port)
    else:
        port = ports.get(timeout=timeout.total_seconds())
        store = TCPStore("127.0.0.1", port, world_size, False, timeout)
    os.environ["MASTER_PORT"] = str(store.port)
    return store


def thread_count(pid: int | str = "self") -> int:
    """Threads of a process (0 if it is gone)."""
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


def thread_names(pid: int | str = "self") -> dict[str, int]:
    """How many threads of a process carry each name (``/proc/<pid>/task/*/comm``): what a
    leak report shows, so that library threads (gloo's, the sync's) and runtime threads (CUDA's,
    autograd's) can be told apart."""
    names: dict[str, int] = {}
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/comm") as comm:
                name = comm.read().strip()
            names[name] = names.get(name, 0) + 1
    except OSError:
        pass
    return dict(sorted(names.items(), key=lambda item: -item[1]))


def release_models() -> int:
    """Close every ``DMPCollection`` a check left open in this worker; return how many.

    Checks build models and drop them; their process groups (each a gloo TCP loop thread
    polling every few ms, plus two work threads) live until ``close()``. The harness
    releases them after every check, the way a user's script ends with ``model.close()``.
    """
    collection = sys.modules.get("sparse2d.core.collection")
    if collection is None:
        return 0
    gc.collect()
    cls = collection.DMPCollection
    models = [o for o in gc.get_objects() if issubclass(type(o), cls) and not o.closed]
    for model in models:
        model.close()
    return len(models)


GROUP_SITES: dict[str, str] = {}
"""In a worker: each process group's name -> where it was made (the innermost project
frames), so a leak report can name the code that left a group alive."""


def _record_group_sites() -> None:
    """Wrap c10d's one group constructor (``new_group``, ``split_group`` and DeviceMesh all
    reach it) to note the project frames that made each group."""
    import torch.distributed.distributed_c10d as c10d

    original = c10d._new_process_group_helper

    def recorded(*args: Any, **kwargs: Any) -> Any:
        made = original(*args, **kwargs)
        group = made[0] if isinstance(made, tuple) else made
        frames = [
            f"{Path(f.filename).name}:{f.lineno} {f.name}"
            for f in traceback.extract_stack()[:-1]
            if "/sparse2d/" in f.filename or "/tests/" in f.filename
        ]
        GROUP_SITES[c10d._world.pg_names.get(group, "?")] = " <- ".join(frames[::-1][:4])
        return made

    c10d._new_process_group_helper = recorded


def live_groups() -> list[str]:
    """This rank's live process groups (WORLD aside): name, ranks and where each was made."""
    import torch.distributed.distributed_c10d as c10d

    return [
        f"{name} ranks={sorted(c10d._world.pg_group_ranks.get(group, {}))} "
        f"made at {GROUP_SITES.get(name, 'start-up')}"
        for group, name in list(c10d._world.pg_names.items())
        if group is not c10d.GroupMember.WORLD
    ]


def _worker(rank: int, world_size: int, ports: Any, tasks: Any, results: Any) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
    )
    os.environ.pop("LOCAL_WORLD_SIZE", None)
    import faulthandler
    import logging

    faulthandler.enable()  # a segfaulting check prints its Python stack (the test's stderr)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # DistWorld.run on a hang
    import torch
    import torch.distributed as dist

    from sparse2d.known_warnings import ignore_known_warnings

    ignore_known_warnings()
    logging.disable(logging.WARNING)  # TorchRec logs every plan at WARNING; failures still raise
    torch.set_num_threads(1)
    if ON_CUDA:
        # Ranks share the GPUs there are; DeviceMesh selects cuda:LOCAL_RANK, which must exist.
        os.environ["LOCAL_RANK"] = str(rank % torch.cuda.device_count())
        torch.cuda.set_device(rank % torch.cuda.device_count())
    timeout = datetime.timedelta(seconds=90)
    store = own_store(rank, world_size, ports, timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)
    dist.barrier()
    _record_group_sites()
    # Import what every check uses, then move it out of the garbage collector's sight: the
    # full collection after each check (``release_models``) then scans only what checks
    # made (0.7 s per check with ~340k library objects tracked, microseconds without).
    import torchrec  # noqa: F401
    from torchrec.distributed.comm import intra_and_cross_node_pg

    import sparse2d.core.collection  # noqa: F401
    import tests.models  # noqa: F401

    # TorchRec makes one intra-node and one cross-node group per process the first time a 1D
    # table-row-wise table is sharded (a reference model), and keeps them for good (its
    # module globals _INTRA_PG/_CROSS_PG). Made here, they are in every check's thread
    # baseline, not a "leak" of whichever test module shards such a table first.
    intra_and_cross_node_pg(backend="gloo")

    gc.collect()
    gc.freeze()
    results.put((rank, None, None, 0))  # joined (this also starts the queue's feeder thread)
    while True:
        task = tasks.get()
        if task is None:
            break
        fn, args, kwargs = task
        try:
            ok, value = True, fn(*args, **kwargs)
        except BaseException as error:  # reported to the parent with the traceback
            ok, value = False, f"{type(error).__name__}: {error}\n{traceback.format_exc()}"
        del fn, args, kwargs, task
        release_models()
        results.put((rank, ok, value, thread_count()))
    dist.destroy_process_group()


class CheckFailed(AssertionError):
    """A check raised on at least one rank."""


class DistWorld:
    """``world_size`` live gloo ranks; ``run(fn, ...)`` calls ``fn`` on all of them."""

    live: list[DistWorld] = []
    """Worlds started and not closed (the leak check and the thread sampler read them)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.baseline: list[int] = [0] * world_size
        """Threads per rank right after joining the world."""
        self.threads: list[int] = [0] * world_size
        """Threads per rank after the latest check (its models released)."""
        self._start()
        DistWorld.live.append(self)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid is not None and p.is_alive()]

    def _start(self) -> None:
        self._ports = ports = _CTX.Queue()  # alive while the ranks start (they unpickle it)
        self._results = _CTX.Queue()
        self._tasks = [_CTX.Queue() for _ in range(self.world_size)]
        self._procs = [
            _CTX.Process(
                target=_worker,
                args=(rank, self.world_size, ports, self._tasks[rank], self._results),
                daemon=True,
            )
            for rank in range(self.world_size)
        ]
        for proc in self._procs:
            proc.start()
        joined, deadline = 0, time.monotonic() + 300
        while joined < self.world_size:
            try:
                self._results.get(timeout=1.0)
                joined += 1
            except queue.Empty:  # a rank that died while joining fails at once, not in 300 s
                dead = {r: p.exitcode for r, p in enumerate(self._procs) if not p.is_alive()}
                if dead or time.monotonic() > deadline:
                    self.close(graceful=False)
                    raise RuntimeError(
                        f"world of {self.world_size} did not start: ranks {sorted(dead)} died "
                        f"(exit codes {list(dead.values())}) or 300 s passed"
                    ) from None
        self.baseline = self.run(thread_count)

    def run(
        self, fn: Callable[..., Any], *args: Any, timeout: float = 240.0, **kwargs: Any
    ) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every rank; return the per-rank results.
        ``SPARSE2D_TEST_CHECK_S`` caps ``timeout`` (a GPU check's budget is minutes)."""
        timeout = min(timeout, float(os.environ.get("SPARSE2D_TEST_CHECK_S", timeout)))
        for q in self._tasks:
            q.put((fn, args, kwargs))
        results: dict[int, tuple[bool, Any]] = {}
        deadline = time.monotonic() + timeout
        while len(results) < self.world_size:
            try:  # short waits: a rank that died (a segfault) fails the check at once
                rank, ok, value, threads = self._results.get(timeout=1.0)
            except queue.Empty:
                dead = {r: p.exitcode for r, p in enumerate(self._procs) if not p.is_alive()}
                if not dead and time.monotonic() < deadline:
                    continue
                missing = sorted(set(range(self.world_size)) - set(results))
                if not dead:  # where each hung rank waits, in the test's captured stderr
                    for rank in missing:
                        os.kill(self._procs[rank].pid, signal.SIGUSR1)
                    time.sleep(2.0)
                self.restart()
                if dead:
                    raise CheckFailed(
                        f"{fn.__name__}: ranks {sorted(dead)} died (exit codes "
                        f"{list(dead.values())}; -11 is a segfault); world restarted"
                    ) from None
                failed = "".join(  # a rank that raised first often left the others waiting
                    f"\n--- rank {r} raised ---\n{v}"
                    for r, (ok, v) in sorted(results.items())
                    if not ok
                )
                raise CheckFailed(
                    f"{fn.__name__} did not finish on ranks {missing} within {timeout}s "
                    f"(hang){failed}"
                ) from None
            results[rank] = (ok, value)
            self.threads[rank] = threads
        failures = {r: v for r, (ok, v) in results.items() if not ok}
        if failures:
            text = "\n".join(f"--- rank {r} ---\n{v}" for r, v in sorted(failures.items()))
            raise CheckFailed(f"{fn.__name__} failed on ranks {sorted(failures)}:\n{text}")
        return [results[r][1] for r in range(self.world_size)]

    def thread_names(self) -> list[dict[str, int]]:
        """Each rank's threads by name (``thread_names``), read from outside the rank."""
        return [thread_names(proc.pid) for proc in self._procs]

    def restart(self) -> None:
        self.close(graceful=False)
        self._start()

    def close(self, graceful: bool = True) -> None:
        if self in DistWorld.live and graceful:
            DistWorld.live.remove(self)
        if graceful:
            for q in self._tasks:
                q.put(None)
            for proc in self._procs:
                proc.join(timeout=10)
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
