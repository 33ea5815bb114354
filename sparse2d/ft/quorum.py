"""The step's quorum: when one is formed (``QuorumLease``: every ``quorum_every`` committed
steps, and after any step a group did not commit), how it is formed (``form``), and the
bounds on its waits.

torchft's quorum is an RPC to the lighthouse (plus, for a group behind, the heal transfer),
run in ``FaultTolerance.start_step`` before the forward: a heal applied there is the
synchronous heal (the group trains the step with the healed state and counts fully). Running
it on a helper thread until the forward (``overlap_quorum``) measured 0.986x the blocking
quorum's samples/s with a quorum every step (``bench/RESULTS.md``, section
ft-overlap-quorum) and was retired: most of the quorum's wait is the cross-group barrier,
not the RPC. torchft's ``Manager`` and the guards around it are ``sparse2d.ft.manager``'s.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from sparse2d.comm_device import flag_device
from sparse2d.errors import ConfigError, FaultToleranceError
from sparse2d.ft.ft_options import FTOptions
from sparse2d.ft.lighthouse import check_reachable
from sparse2d.ft.transport import WaitBudget, wait_by
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


SET_UP = Ballot(Flag("failed", Meaning.ANY))
"""Whether some rank of this group could not set up the quorum's cross-group process group."""


def agree_on_setup(manager: Any) -> None:
    """After a quorum, fail this step on every rank of the group if any rank could not set up
    its cross-group process group (one 1-flag SUM over the group).

    Each rank builds its own group with rank ``r`` of the other groups, and a link cut just
    after the quorum can leave one built and another not: the first went into the step's
    lookups and waited there for the second, whose setup gave up at its deadline, and then
    waited a whole deadline more in the cross-group all-reduce it could now send to the cut
    peer (``bench/chaos.py``'s seed 1: the survivors were back only after the link came
    back). Told here, no rank sends anything over the quorum this step (``ManagedChannel``
    skips a step torchft saw fail), the vote fails it, and the group regroups at the next
    step."""
    failed = manager.errored() is not None
    counting = SET_UP.start({"failed": failed}, None, device=flag_device())
    if counting.wait()["failed"] and not failed:
        manager.report_error(
            FaultToleranceError("another rank of this group could not set up its cross-group group")
        )


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
REGROUP = Ballot(Flag("regroup", Meaning.ANY))
"""Whether some rank of this group would form a quorum at the next step (``QuorumLease.reuses``)."""


class QuorumLease:
    """When a step forms a quorum (``FTOptions.quorum_every``): at the first step, every
    ``every`` committed steps, and at the step after one that some group of the quorum did
    not commit; the steps between reuse the last quorum's groups with no RPC.

    Every rank of every group decides alike: the groups of a quorum share the committed step,
    after each vote one 1-float SUM of the commit flags over each rank's cross-group process
    group (the commit echo, started after the vote and landed when the next step starts)
    tells every group whether all committed, and where the lease would be kept a group's
    ranks agree on what their echoes said (``reuses``). The echo calls
    the process group directly: torchft's ``allreduce`` skips a group whose step failed,
    and that group must be heard. It is not asked where this step's all-reduce failed (that
    rank's group was torn down, and its peers failed too); a failed echo (a peer lost after
    the vote) regroups one step later, with the whole group (``_lost``). A lost group is thus
    seen at once, and a restarted one joins the live groups' next quorum, at most ``every``
    steps later.
    """

    def __init__(
        self, every: int, pg: Callable[[], Any], drop: Callable[[], None], budget: WaitBudget
    ) -> None:
        self.every, self._pg, self._drop = every, pg, drop
        self.budget = budget
        """How long the echo may take (``WaitBudget.seconds``), counted from its start
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
        (lands the echo in flight first); a step that does not counts as one formed.

        Where the lease would be kept, the group's ranks agree first (one 1-flag SUM over
        the group): each rank heard its echo over its own cross-group process group, and
        they can differ. A rank whose echo was lost keeps the lease (``_lost``) while
        another heard that a group failed the step and regroups: the first went into the
        next step's lookups, the second into the quorum, each waiting for the other until
        ``quorum_timeout_s``, and every group of the job restarted (``bench/chaos.py``'s
        short run, a 10 s partition: one group's ring done within ``TRUSTED_SHARE`` of
        ``timeout_s``, another's after it)."""
        self.settle()
        reuse = started and step % self.every != 0
        if reuse:  # every rank of the group is here at this step alike
            counting = REGROUP.start({"regroup": self.regroup}, None, device=flag_device())
            self.regroup = counting.wait()["regroup"]
            reuse = not self.regroup
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
            deadline = time.monotonic() + (0.0 if cut_off else self.budget.seconds())
            self._echo = (work, flag, committed, participants, deadline)
        except Exception:  # the process group went away after the vote (``_lost``)
            self._lost(committed)

    def settle(self) -> None:
        """Wait for the echo in flight, if any, until its deadline (its budget after it
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
        group regroups at the step after (at once where another rank heard that a group
        failed: the ranks agree in ``reuses``)."""
        self._drop()
        self.regroup = not committed
