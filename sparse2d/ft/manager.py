"""torchft's ``Manager`` for one group: built (``torchft_manager``), guarded (a fresh
rendezvous prefix per quorum, quorums of this job only, a deadline on ``wait_quorum`` and on
each process group's setup), and
its cross-group process group dropped after a failure without waiting (``drop_process_group``,
freed on the ``_Reaper``'s thread).

``sparse2d.ft.quorum`` decides when a step forms a quorum and how long its waits last; this
module holds what sparse2d puts around torchft so that those waits stay bounded.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from sparse2d.ft.ft_options import FTOptions
from sparse2d.ft.lighthouse import check_job, check_reachable, job_replica_ids, replica_id

logger = logging.getLogger(__name__)


def torchft_manager(
    options: FTOptions,
    restore: Callable[[dict[str, Any]], None],
    capture: Callable[[], dict[str, Any]],
    setup_s: Callable[[], float] | None = None,
) -> tuple[Any, Any]:
    """This rank's cross-group process group and torchft ``Manager``, after checking on
    every rank that the lighthouse answers (one line instead of a hang) and serves this job
    (``check_job``: a group never joins another job's quorum). ``setup_s``: how long each
    quorum's process-group setup may take (``WaitBudget.seconds``; None: ``timeout_s``)."""
    address, job = options.lighthouse_address(), options.job_id()
    check_reachable(address, options.connect_timeout_s)
    check_job(address, job, options.connect_timeout_s)
    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo

    seconds = datetime.timedelta
    pg = ProcessGroupGloo(timeout=seconds(seconds=options.timeout_s))
    manager = Manager(
        pg=pg,
        load_state_dict=restore,
        state_dict=capture,
        min_replica_size=options.min_replica_size,
        use_async_quorum=False,  # heal before the forward: the sender waits at a safe point
        timeout=seconds(seconds=options.timeout_s),
        quorum_timeout=seconds(seconds=options.quorum_timeout_s),
        connect_timeout=seconds(seconds=options.connect_timeout_s),
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        lighthouse_addr=address,
        replica_id=replica_id(options.replica_id, job),
        init_sync=True,  # groups at step 0 copy the quorum's first group: one start state
    )
    bound_quorum_wait(manager, options.quorum_timeout_s)
    refuse_strangers(manager, job)
    set_up_groups_by_deadline(pg, manager, setup_s or (lambda: options.timeout_s))
    fresh_store_prefix(manager, pg)  # wraps the guarded client and the deadline's configure
    return pg, manager


def fresh_store_prefix(manager: Any, pg: Any) -> None:
    """Key each cross-group process group's rendezvous by the quorum's step as well as its id.

    torchft keys a new process group's rendezvous in the primary group's store by the quorum
    id alone (``/torchft/{quorum_id}/{rank}``). A lighthouse that restarts counts quorum ids
    from 1 again, so the next process group met the keys a former quorum of that id left in
    the same store: gloo dialed the former members' addresses and the setup failed ("Gloo
    connectFullMesh failed ... Connection refused"), every group stopped after
    ``quorum_timeout_s`` (``bench/chaos.py``, a 2 s lighthouse restart). Every member of a
    quorum gets the same ``max_step``, and a lighthouse's ids only grow, so ``(id, step)``
    names one setup (a restarted lighthouse would have to reach a former id at the same step).
    Where a restarted lighthouse reuses this group's current id with other members, torchft
    keeps the old process group; the step's all-reduce then fails and the next quorum builds
    a fresh one (``drop_process_group``)."""
    seen = {"max_step": 0}
    client = manager._client

    class Client:
        """torchft's manager client, noting each quorum's ``max_step``."""

        def __getattr__(self, name: str) -> Any:
            return getattr(client, name)

        def _quorum(self, *args: Any, **kwargs: Any) -> Any:
            result = client._quorum(*args, **kwargs)
            seen["max_step"] = int(result.max_step)
            return result

    manager._client = Client()
    configure = pg.configure

    def configure_at_step(store_addr: str, *args: Any, **kwargs: Any) -> None:
        address, _, prefix = store_addr.partition("/")
        configure(f"{address}/step{seen['max_step']}/{prefix}", *args, **kwargs)

    pg.configure = configure_at_step


class JobOnlyQuorums:
    """torchft's ``ManagerClient`` (``Manager._client``), answering only quorums of this job's
    groups: a quorum the lighthouse formed with any other replica id is asked again.

    The lighthouse admits whatever asks it for a quorum (torchft has no authentication): a
    stranger's request lands in the job's next quorum, and torchft would then build the
    cross-group process group on the stranger's store, heal from it (when it claims a later
    step) or send it the job's state. The check runs on the quorum's answer, before torchft
    uses any of it; the stranger's one quorum passes, and the lighthouse forms the next
    without it once the stranger stops asking (after its ``join_timeout_ms`` straggler wait).
    Every rank of a group sees the same answer and asks again alike. ``refused`` lists the
    foreign replica ids seen, for the trainer's records."""

    def __init__(self, client: Any, job: str | None) -> None:
        self._client, self._mine, self.refused = client, job_replica_ids(job), []

    def _quorum(self, **kwargs: Any) -> Any:
        deadline = time.monotonic() + kwargs["timeout"].total_seconds()
        while True:
            quorum = self._client._quorum(**kwargs)
            foreign = sorted(
                r for r in quorum.replica_ids if not self._mine.fullmatch(r.split(":")[0])
            )
            if not foreign:
                return quorum
            self.refused.extend(foreign)
            left = deadline - time.monotonic()
            logger.warning("quorum %s refused: foreign replica ids %s", quorum.quorum_id, foreign)
            if left <= 0:
                raise TimeoutError(f"every quorum held foreign replica ids ({foreign[0]})")
            kwargs = dict(kwargs, timeout=datetime.timedelta(seconds=left))

    def __getattr__(self, name: str) -> Any:  # should_commit, _checkpoint_metadata, ...
        return getattr(self._client, name)


def refuse_strangers(manager: Any, job: str | None) -> JobOnlyQuorums:
    """Put :class:`JobOnlyQuorums` between ``manager`` and its quorum RPC; returned."""
    guard = JobOnlyQuorums(manager._client, job)
    manager._client = guard
    return guard


def bound_quorum_wait(manager: Any, limit_s: float) -> None:
    """Give torchft's ``Manager.wait_quorum`` a deadline: ``limit_s``
    (``fault_tolerance.quorum_timeout_s``) from the quorum's start, for all of it.

    torchft bounds the lighthouse RPC by ``quorum_timeout`` and each heal transfer by
    ``timeout``, but its ``wait_quorum`` waits on the quorum thread's future with no timeout
    of its own: a process-group setup or a heal that stalls there (a peer's link cut
    mid-quorum) would hold the step without end. ``start_quorum`` calls ``wait_quorum`` right
    after it starts the quorum thread, so the deadline is the RPC's own, and it covers the
    setup and the heal as well; past it, ``form`` stops the group with one line, as a
    quorum that never formed, and torchrun restarts it (it heals from the live groups)."""

    def wait_quorum() -> None:
        future = manager._quorum_future
        if future is None:
            raise RuntimeError("torchft's wait_quorum before start_quorum")
        try:
            future.result(timeout=limit_s)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(
                f"torchft's quorum (lighthouse, process group, heal) not done within {limit_s:g} s"
            ) from None

    manager.wait_quorum = wait_quorum


def drop_process_group(pg: Any, manager: Any) -> None:
    """Tear the cross-group process group down after a failed collective, without waiting.

    Peers still blocked in that collective then fail immediately instead of after the
    gloo timeout: with 3 groups, a survivor waiting on another survivor (who already gave
    up and waits for the next quorum) would otherwise hold both until the timeout. The
    next quorum must build a fresh group even if its members did not change, so the
    manager's quorum id is forgotten (torchft 0.2 reconfigures only on a new id).

    The process group is taken out of torchft's wrapper (which builds a fresh one at the
    next quorum) and handed to one daemon thread (``_Reaper``) that aborts it and drops the
    last reference to it: gloo's abort, and its destructor, wait for the collective in
    flight, and one whose peer's link is cut ends only when the link is back. Aborted here,
    survivors stalled for a whole partition (33.4 s for a 31.8 s cut, ``bench/chaos.py`` seed
    1); aborted on a thread but freed here, when that thread ended first, a survivor froze in
    the destructor at its next quorum and held every group there (36.9 s for a 36.1 s cut,
    a partition just after a heal). The abandoned collective may still finish later: its
    buffers are never reused (``SendArena.forget``), and a peer cannot commit it alone
    (``transport.TRUSTED_SHARE``).
    """
    _hand_to_reaper(pg)
    manager._quorum_id = -1


def _hand_to_reaper(pg: Any) -> None:
    """Move the process group out of torchft's wrapper ``pg`` (which then builds a new one
    at its next ``configure``) to the reaper, keeping no reference here."""
    handoff = [getattr(pg, "_pg", None)]  # the wrapper's reference moves into the box ...
    pg._pg = None  # ... and the box's is the only one left
    if handoff[0] is not None:
        _REAPER.take(handoff)


CONFIGURED = (
    "_pg",
    "_replica_id",
    "_rank",
    "_quorum_id",
    "_group_rank",
    "_group_world_size",
    "_global_ranks",
)
"""What torchft's ``ProcessGroupWrapper.configure`` sets: moved from the spare wrapper that
built a group to the one torchft's manager and sparse2d's transport hold."""


def set_up_groups_by_deadline(pg: Any, manager: Any, limit_s: Callable[[], float]) -> None:
    """Build each quorum's cross-group process group on a thread of its own, and give up on
    it ``limit_s()`` (``WaitBudget.seconds``: what a silent peer is given) after it began.

    torchft sets the group up on its quorum thread, which the step waits for: it reads the
    members' addresses from the primary group's store and connects to each. A member whose
    link is cut just after the quorum formed answers neither, and torchft's timeout ends
    neither wait: a store that stopped answering held the setup for as long as it stayed
    silent (``tests/test_ft_manager.py``), and a cut just after a quorum held the survivors
    past the cut (``bench/chaos.py``'s seed 1). Past the deadline the setup raises: torchft
    reports the error, the step fails its commit, and the next quorum forms without the cut
    group. The abandoned setup's group, if it ever completes, goes to the reaper unused.

    The group the new quorum replaces goes to the reaper first: torchft's ``configure``
    would abort and free it on the quorum thread, and gloo's destructor waits for whatever
    that group still has in flight toward a cut peer."""
    make = type(pg)

    def configure_by_deadline(*args: Any, **kwargs: Any) -> None:
        _hand_to_reaper(pg)
        spare = make(timeout=pg._timeout)
        lock, outcome, finished = threading.Lock(), {}, threading.Event()

        def set_up() -> None:
            try:
                spare.configure(*args, **kwargs)
            except Exception as error:  # raised on the quorum thread below
                outcome["error"] = error
            with lock:
                if "abandoned" in outcome:
                    _hand_to_reaper(spare)
                    return
                outcome["done"] = True
            finished.set()

        threading.Thread(target=set_up, name="sparse2d_pg_setup", daemon=True).start()
        waited_s = limit_s()
        finished.wait(waited_s)
        with lock:
            if "done" not in outcome:
                outcome["abandoned"] = True
        if "done" not in outcome or "error" in outcome:
            manager._quorum_id = -1  # the next quorum builds a group, whatever its id
        if "done" not in outcome:
            raise TimeoutError(
                f"cross-group process group not set up within {waited_s:.3g} s "
                "(fault_tolerance.timeout_s less its reserve): a member of the quorum did not "
                "answer"
            )
        if "error" in outcome:
            raise outcome["error"]
        for name in CONFIGURED:
            setattr(pg, name, getattr(spare, name))

    pg.configure = configure_by_deadline


class _Reaper:
    """One daemon thread that aborts abandoned, replaced and late-built process groups and
    frees them, so that no wait of theirs (abort, destructor) ever runs on a training thread
    or on torchft's quorum thread, which the step waits for."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[list[Any]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def take(self, handoff: list[Any]) -> None:
        """Own ``handoff``'s one process group from now on (the caller keeps no other
        reference: the thread empties the box, so its own is the last)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="sparse2d_abort", daemon=True
                )
                self._thread.start()
        self._queue.put(handoff)

    def _run(self) -> None:
        while True:
            stuck = self._queue.get().pop()
            try:
                stuck.abort()
            except Exception as error:  # already torn down: nothing left to release
                logger.info("process group abort: %s", error)
            del stuck  # the last reference: its destructor waits here, never in training


_REAPER = _Reaper()
