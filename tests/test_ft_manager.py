"""``sparse2d.ft.manager``: torchft's manager for one group and the guards around it, on
real torchft and gloo: the quorum's deadline (a stalled process-group setup), quorums of this
job only (a stranger at the lighthouse), a dropped or replaced process group freed off the
training and quorum threads, and a setup toward a silent store given up after ``timeout_s``.
"""

from __future__ import annotations

import datetime
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from sparse2d.ft.lighthouse import replica_id, start_lighthouse
from sparse2d.ft.manager import JobOnlyQuorums
from tests.ft_groups import run_groups


def _stalled_quorum(group: int, lighthouse: str, quorum_timeout_s: float, stall_s: float):
    """This group's first quorum, with torchft's process-group setup stalled ``stall_s``
    (as a setup toward a peer whose link was cut mid-quorum): ``(seconds in form, its error
    line or None)``."""
    import time

    from sparse2d.errors import FaultToleranceError
    from sparse2d.ft.ft_options import FTOptions
    from sparse2d.ft.manager import torchft_manager
    from sparse2d.ft.quorum import form

    options = FTOptions(
        replica_id=group,
        num_groups=1,
        min_replica_size=1,
        lighthouse=lighthouse,
        timeout_s=10,
        quorum_timeout_s=quorum_timeout_s,
    )
    pg, manager = torchft_manager(options, lambda state: None, lambda: {})
    configure = pg.configure

    def stalled_configure(*args, **kwargs):  # on torchft's quorum thread
        time.sleep(stall_s)
        return configure(*args, **kwargs)

    pg.configure = stalled_configure
    started = time.monotonic()
    try:
        form(manager, options)
        error = None
    except FaultToleranceError as stop:
        error = str(stop)
    return time.monotonic() - started, error


def test_a_stalled_quorum_stops_the_group_within_quorum_timeout_s() -> None:
    """torchft's ``wait_quorum`` has no timeout of its own: a quorum whose process-group
    setup stalls is given up ``quorum_timeout_s`` after it started, with the one line of a
    quorum that never formed (the group stops, torchrun restarts it, it heals), not when
    the setup ends (30 s here)."""
    lighthouse = start_lighthouse(min_replicas=1)
    try:
        out = run_groups(1, 1, _stalled_quorum, lighthouse.address(), 2.0, 30.0, timeout=120)
    finally:
        lighthouse.shutdown()
    seconds, error = out[(0, 0)]
    assert error is not None and "quorum_timeout_s=2 (TimeoutError" in error, error
    assert 1.8 < seconds < 5.0, seconds


def test_a_quorum_with_another_jobs_group_is_asked_again_without_it() -> None:
    """A group of another job asks the job's lighthouse for a quorum, claiming a later step
    (torchft would heal the job's groups from it): the lighthouse admits it to the job's
    next quorum, and :class:`JobOnlyQuorums` asks again; the answer holds the job's groups
    only. Real torchft: its lighthouse, two groups' manager servers and their clients."""
    from torchft._torchft import LighthouseClient, ManagerClient, ManagerServer

    lighthouse = start_lighthouse(min_replicas=2)
    address, seconds = lighthouse.address(), datetime.timedelta(seconds=10)
    servers, guards = [], []
    try:
        for g in (0, 1):
            servers.append(
                ManagerServer(
                    replica_id(g, "job-a"),
                    address,
                    "localhost",
                    "[::]:0",
                    "localhost:1",
                    1,
                    datetime.timedelta(milliseconds=100),
                    seconds,
                    0,
                )
            )
            guards.append(JobOnlyQuorums(ManagerClient(servers[g].address(), seconds), "job-a"))
        stranger = ThreadPoolExecutor(1).submit(
            LighthouseClient(address, seconds).quorum,
            replica_id=replica_id(0, "job-b"),
            timeout=datetime.timedelta(seconds=30),
            address="http://localhost:9",
            store_address="localhost:9",
            step=10**6,
            world_size=1,
            shrink_only=False,
        )
        time.sleep(0.5)  # the stranger asks first: it waits for a second member
        with ThreadPoolExecutor(2) as pool:
            asked = [
                pool.submit(
                    guards[g]._quorum,
                    group_rank=0,
                    step=5,
                    checkpoint_metadata="",
                    shrink_only=False,
                    timeout=datetime.timedelta(seconds=30),
                    commit_failures=0,
                    init_sync=True,
                )
                for g in (0, 1)
            ]
            answers = [a.result(timeout=60) for a in asked]
        got = sorted(p.replica_id.split(":")[0] for p in stranger.result(timeout=10).participants)
        assert got == sorted(
            [replica_id(0, "job-a"), replica_id(1, "job-a"), replica_id(0, "job-b")]
        )
        for guard, answer in zip(guards, answers, strict=True):
            assert guard.refused == [replica_id(0, "job-b")], guard.refused
            assert sorted(r.split(":")[0] for r in answer.replica_ids) == [
                replica_id(0, "job-a"),
                replica_id(1, "job-a"),
            ]
            assert answer.max_step == 5 and not answer.heal  # nothing taken from the stranger
    finally:
        for server in servers:
            server.shutdown()
        lighthouse.shutdown()


class _CutGroup:
    """Stands for gloo's process group after its peer's link was cut: ``abort`` returns at
    once (as gloo's did in the chaos run) and freeing it waits for the collective in flight
    (gloo's destructor joins its workers), here 1 s; records the thread that froze in it."""

    def __init__(self, freed: list[str]) -> None:
        self.freed = freed

    def abort(self) -> None:
        return None

    def __del__(self) -> None:
        self.freed.append(threading.current_thread().name)
        time.sleep(1.0)


def test_a_dropped_process_group_is_freed_off_the_training_thread() -> None:
    """``drop_process_group`` returns at once and the group's last reference is dropped on
    the reaper thread: freed on the caller's thread, a survivor froze in gloo's destructor
    at its next quorum and held every group for the whole partition (36.9 s, 36.1 s cut)."""
    from types import SimpleNamespace

    from sparse2d.ft.manager import drop_process_group

    for _ in range(5):  # the reaper may finish before or after the caller returns
        freed: list[str] = []
        wrapper, manager = SimpleNamespace(_pg=_CutGroup(freed)), SimpleNamespace(_quorum_id=3)
        began = time.monotonic()
        drop_process_group(wrapper, manager)
        assert time.monotonic() - began < 0.5 and wrapper._pg is None
        assert manager._quorum_id == -1  # the next quorum builds a fresh group
        deadline = time.monotonic() + 10
        while not freed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert freed == ["sparse2d_abort"], freed


def _store() -> tuple[object, str]:
    """A real TCPStore server and its address, as torchft's quorum hands it to ``configure``."""
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    return server, f"127.0.0.1:{server.port}/torchft/4/0"


def _guarded_wrapper(limit_s: float) -> tuple[object, object]:
    """torchft's process-group wrapper and a stand-in for its manager's quorum id, with the
    setup guard installed as ``torchft_manager`` installs it."""
    from types import SimpleNamespace

    from torchft.process_group import ProcessGroupGloo

    from sparse2d.ft.manager import set_up_groups_by_deadline

    wrapper = ProcessGroupGloo(timeout=datetime.timedelta(seconds=limit_s))
    manager = SimpleNamespace(_quorum_id=4)
    set_up_groups_by_deadline(wrapper, manager, lambda: limit_s)
    return wrapper, manager


def test_a_replaced_process_group_is_freed_off_the_quorum_thread() -> None:
    """torchft's ``configure`` aborts and frees the group a new quorum replaces on its quorum
    thread, which the step waits for; the guard hands that group to the reaper first and
    builds the new one. Breaks if the guard keeps a reference to the replaced group or frees
    it itself (1 s here, the whole cut on a cut link)."""
    server, address = _store()
    for _ in range(3):
        freed: list[str] = []
        wrapper, _ = _guarded_wrapper(limit_s=5.0)
        wrapper._pg = _CutGroup(freed)
        began = time.monotonic()
        wrapper.configure(address, "group_1", 0, 1)
        assert time.monotonic() - began < 0.9, time.monotonic() - began
        assert wrapper._pg is not None and not isinstance(wrapper._pg, _CutGroup)
        assert wrapper._rank == 0 and wrapper._replica_id == "group_1"
        deadline = time.monotonic() + 10
        while not freed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert freed == ["sparse2d_abort"], freed
    del server


def test_a_setup_toward_a_silent_store_fails_within_timeout_s() -> None:
    """A store that accepts and then never answers (its host's link cut just after the
    quorum formed) holds torchft's own setup past its timeout, for as long as it stays
    silent (a cut just after a quorum held the survivors past the cut). The guard gives
    up after ``timeout_s``: the setup raises, the wrapper holds no group, and the next quorum
    builds one whatever its id. Breaks without the guard (the setup is still waiting when
    the test gives up on it) or with the deadline dropped."""
    import socket

    silent = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(silent.accept()[0])  # reads nothing, answers nothing
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    wrapper, manager = _guarded_wrapper(limit_s=1.0)
    outcome: list[object] = []

    def configure() -> None:  # torchft's quorum thread
        try:
            wrapper.configure(f"127.0.0.1:{silent.getsockname()[1]}/torchft/4/0", "g", 0, 2)
            outcome.append("configured")
        except TimeoutError as error:
            outcome.append(error)

    began = time.monotonic()
    quorum_thread = threading.Thread(target=configure, daemon=True)
    quorum_thread.start()
    quorum_thread.join(10)
    took = time.monotonic() - began
    try:
        assert outcome and isinstance(outcome[0], TimeoutError), (outcome, took)
        assert 1.0 <= took < 3.0, took
        assert "fault_tolerance.timeout_s" in str(outcome[0])
        assert wrapper._pg is None and manager._quorum_id == -1
    finally:
        silent.close()  # the abandoned setup then fails and hands its group to the reaper
        for connection in held:
            connection.close()
