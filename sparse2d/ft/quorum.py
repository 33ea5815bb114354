"""The step's quorum: when one is formed (``QuorumLease``: every ``quorum_every`` committed
steps, and after any step a group did not commit), how it is formed (``form``), and the
bounds on its waits.

torchft's quorum is an RPC to the lighthouse (plus, for a group behind, the heal transfer),
run in ``FaultTolerance.start_step`` before the forward: a heal applied there is the
synchronous heal (the group trains the step with the healed state and counts fully). Running
it on a helper thread until the forward (``overlap_quorum``) measured no faster on the
2-core host (0.80-0.85x vs 0.84x the standard launcher's samples/s) and was retired: most of
the quorum's wait is the cross-group barrier, not the RPC.
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

import torch
import torch.distributed as dist

from sparse2d.errors import ConfigError, FaultToleranceError
from sparse2d.ft.ft_options import FTOptions
from sparse2d.ft.lighthouse import check_job, check_reachable, job_replica_ids, replica_id
from sparse2d.ft.transport import wait_by
from sparse2d.sync.ballot import Ballot, Flag, Meaning

logger = logging.getLogger(__name__)
START_POLL_S = 0.25
"""Seconds between the first step's quorum polls, and the wait of each short quorum."""


STOP_MEET_S = 10.0
"""At most this long a rank whose quorum failed waits for the other ranks of its group."""
QUORUM_FAILED_KEY = "sparse2d/ft/quorum_failed/{replica_id}"
"""The group store's count of this group's ranks whose quorum failed (``_stop_together``)."""
QUORUM_REPORTED_KEY = "sparse2d/ft/quorum_reported/{replica_id}"
"""The count of those ranks that have said why they stop (``_reported_together``)."""
QUORUM_LEFT_KEY = "sparse2d/ft/quorum_left/{replica_id}"
"""The count of those ranks done with the store; rank 0, which hosts it, leaves last."""
LEAVE_WAIT_S = 2.0
"""At most this long rank 0 waits for the others to be done with the store it hosts."""


def _meet(key: str, ranks: int, limit_s: float) -> int:
    """Add this rank to the store counter ``key`` and wait, up to ``limit_s``, until it
    reaches ``ranks``; return the count seen last (0 when the store is gone)."""
    try:
        store = dist.distributed_c10d._get_default_store()
        seen = store.add(key, 1)
        deadline = time.monotonic() + limit_s
        while seen < ranks and time.monotonic() < deadline:
            time.sleep(0.02)
            seen = store.add(key, 0)
        return seen
    except Exception as error:  # the store went away with its rank: nobody left to wait for
        logger.info("quorum failure not met by the group: %s", error)
        return 0


def _stop_together(options: FTOptions) -> int:
    """Wait, up to ``STOP_MEET_S``, until every rank of this group failed its quorum too;
    return how many did.

    The ranks' quorum calls start a scheduling delay apart, and so do their timeouts; the
    first rank to exit makes torchrun stop the others, which then never print their line.
    Met in the group's store, not a collective: a rank whose quorum did form is in the step's
    collectives, and this rank then stops after the wait."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return 1
    key = QUORUM_FAILED_KEY.format(replica_id=options.replica_id)
    return _meet(key, dist.get_world_size(), min(STOP_MEET_S, options.quorum_timeout_s))


def _reported_together(options: FTOptions, failed: int) -> None:
    """After saying its line, wait until the ``failed`` ranks that met in ``_stop_together``
    said theirs (up to ``STOP_MEET_S``): torchrun stops the group within its monitor interval
    (0.1 s) of the first exit, and a rank descheduled between the meeting and its line lost
    the line that way (a suite run under load)."""
    if failed <= 1:
        return
    key = QUORUM_REPORTED_KEY.format(replica_id=options.replica_id)
    seen = _meet(key, failed, min(STOP_MEET_S, options.quorum_timeout_s))
    # rank 0 hosts the store (sparse2d.train.rendezvous): leaving first, it broke the others'
    # last poll, and each printed a C++ "Connection reset by peer" trace after its line
    left = QUORUM_LEFT_KEY.format(replica_id=options.replica_id)
    _meet(left, seen if dist.get_rank() == 0 else 0, LEAVE_WAIT_S)  # others: count, go


def form(manager: Any, options: FTOptions) -> int:
    """Join this step's quorum (torchft's ``start_quorum``; heals a group that is behind) and
    return its number of groups. The lighthouse is first waited for (a TCP connect, up to
    ``quorum_timeout_s``, which the quorum's RPC then finishes). A refused heal (another
    plan) stays a ``ConfigError``; anything else, one line. The count is read here once per quorum: torchft's
    ``num_participants()`` enters a profiler ``record_function`` at every call, and a step
    asked it ~7 times (~0.9 of 36 profiled main-thread CPU seconds over 1000 steps)."""
    try:
        started = time.monotonic()
        # A lighthouse restarted at its address (killed, rescheduled) is waited for here, up
        # to quorum_timeout_s: a quorum RPC sent while it is down fails on one rank of the
        # group only and holds the others for the whole timeout, so every group stopped at
        # once and none was left to heal from (a 2 s lighthouse restart ended the job).
        check_reachable(options.lighthouse_address(), options.quorum_timeout_s)
        left = options.quorum_timeout_s - (time.monotonic() - started)
        manager.start_quorum(timeout=datetime.timedelta(seconds=max(left, START_POLL_S)))
        return int(manager.num_participants())
    except ConfigError:  # a heal refused: the live group runs another plan/config
        raise
    except Exception as error:  # quorum RPC timed out or the lighthouse went away
        failed = _stop_together(options)
        stop = FaultToleranceError(
            f"group {options.replica_id}: no quorum of >= "
            f"{options.min_replica_size} group(s) within fault_tolerance.quorum_timeout_s="
            f"{options.quorum_timeout_s:g} ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''})"
        )
        stop.after_report = lambda: _reported_together(options, failed)
        raise stop from None


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
    handoff = [getattr(pg, "_pg", None)]  # the wrapper's reference moves into the box ...
    pg._pg = None  # ... and torchft's wrapper builds a new group at the next quorum
    if handoff[0] is not None:
        _REAPER.take(handoff)
    manager._quorum_id = -1


class _Reaper:
    """One daemon thread that aborts abandoned process groups and frees them, so that no
    wait of theirs (abort, destructor) ever runs on a training thread."""

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


class ShortQuorums:
    """Stop, on every rank, after ``quorum_timeout_s`` of quorums below ``min_replica_size``.

    torchft answers such a step with a failed commit and retries forever (a lighthouse
    with a lower ``min_replicas`` forms them). Steps are counted, not timed, and each
    short one waits ``START_POLL_S``: every rank of the group decides alike.
    """

    def __init__(self, options: FTOptions, participants: Callable[[], int]) -> None:
        self.options, self._participants, self.steps = options, participants, 0

    def after_step(self, short: bool) -> None:
        self.steps = self.steps + 1 if short else 0
        if not short:
            return
        time.sleep(START_POLL_S)
        if self.steps * START_POLL_S >= self.options.quorum_timeout_s:
            stop = FaultToleranceError(
                f"group {self.options.replica_id}: only {self._participants()} group(s) in the "
                f"quorum for fault_tolerance.quorum_timeout_s={self.options.quorum_timeout_s:g} "
                f"(min_replica_size={self.options.min_replica_size}); start the missing groups "
                "or lower min_replica_size"
            )
            ranks = dist.get_world_size() if dist.is_initialized() else 1  # all decide alike
            stop.after_report = lambda: _reported_together(self.options, ranks)
            raise stop


ECHO = Ballot(Flag("committed", Meaning.ALL))
"""The commit echo's ballot: did every group in the quorum commit the step?"""


class QuorumLease:
    """When a step forms a quorum (``FTOptions.quorum_every``): at the first step, every
    ``every`` committed steps, and at the step after one that some group of the quorum did
    not commit; the steps between reuse the last quorum's groups with no RPC.

    Every rank of every group decides alike: the groups of a quorum share the committed step,
    and after each vote one 1-float SUM of the commit flags over each rank's cross-group
    process group (the commit echo, started after the vote and landed when the next step
    starts) tells every group whether all committed. The echo calls
    the process group directly: torchft's ``allreduce`` skips a group whose step failed,
    and that group must be heard. It is not asked where this step's all-reduce failed (that
    rank's group was torn down, and its peers failed too); a failed echo (a peer lost after
    the vote) regroups one step later, with the whole group (``_lost``). A lost group is thus
    seen at once, and a restarted one joins the live groups' next quorum, at most ``every``
    steps later.
    """

    def __init__(
        self, every: int, pg: Callable[[], Any], drop: Callable[[], None], timeout_s: float
    ) -> None:
        self.every, self._pg, self._drop = every, pg, drop
        self.timeout_s = timeout_s
        """How long the echo may take (``fault_tolerance.timeout_s``), counted from its start
        (``after_vote``), not from the wait (``settle``). Waited for explicitly: gloo's own
        timeout did not end an echo whose peer's link was cut (no reset arrives), which held
        one rank of a survivor group until the link came back while its other rank waited
        for it in the next quorum (emulated cluster, a 60 s partition). From its start: the
        next step's all-reduce runs while the echo is in flight, and when a partition lands
        there it fails after ``timeout_s`` first; a fresh ``timeout_s`` at the settle then
        stalled the survivors ``2 x timeout_s`` (one deadline for both waits: ``timeout_s``
        plus one step)."""
        self.regroup = True
        """Form a quorum at the next step (first step; a group failed, was lost or is behind)."""
        self.formed = 0
        """Quorums formed (torchft's quorum RPC), over the whole run."""
        self._echo: tuple[Any, torch.Tensor, bool, int, float] | None = None
        """The echo in flight: (work, flags, this group committed, groups in the quorum, its
        deadline on ``time.monotonic()``)."""

    def reuses(self, started: bool, step: int) -> bool:
        """Whether the step that starts at committed step ``step`` keeps the last quorum
        (lands the echo in flight first); a step that does not counts as one formed."""
        self.settle()
        reuse = started and not self.regroup and step % self.every != 0
        self.formed += not reuse
        return reuse

    def after_vote(
        self, committed: bool, pg_failed: bool, participants: int, cut_off: bool = False
    ) -> None:
        """Start the commit echo (class docstring). It lands when the next step decides
        (``settle``), so its latency hides behind the write-back, the dense optimizer step
        and the loop's work before the next step.

        ``cut_off``: another rank of this group had its cross-group all-reduce fail (the
        group's vote says so): a peer is lost or cut off and this group regroups whatever
        the echo says. The echo is still sent, for the peers that hear it, but not waited
        for: a rank whose own all-reduce had gone through waited for its echo to a cut peer
        and held the group's next quorum until the link was back (33.6 s for a 30 s cut,
        timeout_s=20, the emulated partition test)."""
        self.settle()
        self.regroup = True
        if pg_failed or self.every == 1:
            return
        flag = ECHO.encode({"committed": committed}, dtype=torch.float32)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.SUM
        try:
            work = self._pg().allreduce([flag], opts)
            deadline = time.monotonic() + (0.0 if cut_off else self.timeout_s)
            self._echo = (work, flag, committed, participants, deadline)
        except Exception:  # the process group went away after the vote (``_lost``)
            self._lost(committed)

    def settle(self) -> None:
        """Wait for the echo in flight, if any, until its deadline (``timeout_s`` after it
        started): regroup next step unless every group committed (a failed echo, a peer lost
        after the vote or its link cut, regroups too)."""
        if self._echo is None:
            return
        (work, flag, committed, participants, deadline), self._echo = self._echo, None
        try:
            wait_by(work, deadline, "commit echo")
        except Exception:  # a peer lost after the vote, or its link cut (the deadline)
            self._lost(committed)
            return
        self.regroup = not (committed and ECHO.read(flag, ranks=participants)["committed"])

    def _lost(self, committed: bool) -> None:
        """This rank's echo failed: a peer was lost after the vote. The other ranks of this
        group may have heard a full echo (their peers lived), so a quorum asked by this rank
        alone would meet them in the next step's collectives, each waiting for the other
        until ``quorum_timeout_s`` (seen in a kill test). So this rank keeps the group's
        answer (``committed``) and tears its cross-group process group down: its next
        all-reduce fails at once, the group's vote fails as one, and every rank of the
        group regroups at the step after."""
        self._drop()
        self.regroup = not committed


def torchft_manager(
    options: FTOptions,
    restore: Callable[[dict[str, Any]], None],
    capture: Callable[[], dict[str, Any]],
) -> tuple[Any, Any]:
    """This rank's cross-group process group and torchft ``Manager``, after checking on
    every rank that the lighthouse answers (one line instead of a hang) and serves this job
    (``check_job``: a group never joins another job's quorum)."""
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
    fresh_store_prefix(manager, pg)  # wraps the guarded client: notes accepted quorums
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
