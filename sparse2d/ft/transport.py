"""Fault tolerance's transport: torchft's managed process group as a sync channel.

A fault-tolerant step sends ONE all-reduce per dtype over the quorum (torchft's managed
group: rank ``r`` of every sharding group): the sync's copies, the dense gradients and the
step's control vector together (``ManagedChannel.start_tensors``), so a step pays one
cross-group latency, not three. The sync (``sparse2d.sync.policy``) starts its averages and
hands its blocking parts to this channel; the channel keeps them until the step's vote
(``sparse2d.ft.commit``): ``commit`` lands them, ``discard`` drops them (every shard keeps its
own values). The sync knows nothing of commits.

The step's send buffer (``SendArena``): the sync's copies are gathered straight into it.
Gathering them into buffers of their own and then flattening them with the gradients into a
fresh send buffer (and back out after the all-reduce) costs two extra passes over every
embedding row synced and a second payload-sized allocation at the peak. ``SendArena`` is the
engine's ``BufferPool``, handing out the copies' buffers as consecutive regions at the front
of one flat buffer per dtype, with room behind them for the gradients and the control vector.
The copies are then averaged where they are; only the small tail is copied in and out.
Regions live until the sync parts held in them have landed or been dropped (the next step's
payload reuses them), which is when ``BufferPool``'s buffers were free as well. Anything the
arena cannot place exactly (another layout, a region handed out before the buffer grew, a
payload not built by the engine) is sent through a fresh flat buffer as before.
"""

from __future__ import annotations

import datetime
import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from sparse2d.sync.collectives import AllReduceHook
from sparse2d.sync.policy import InFlight
from sparse2d.sync.shards import by_dtype


class ManagedChannel:
    """torchft's managed process group: rank ``r`` of every group in the current quorum.
    Errors do not raise here: they are reported to torchft's manager (whoever built the
    channel decides what a failed collective means for the parts it holds)."""

    keeps = True
    """Handed parts wait for the step's vote (``commit`` or ``discard``)."""
    members_change = True

    def __init__(
        self, manager: Any, quorum_pg: Any, participants: Callable[[], int], budget: WaitBudget
    ) -> None:
        self.manager = manager
        self.budget = budget
        """When each collective is given up (``WaitBudget``: from the step's start inside a
        step, else from its own; ``wait_by``)."""
        self._participants = participants
        """Groups in the current quorum (``FaultTolerance.participants``: read from torchft
        once per quorum)."""
        self.quorum_pg = quorum_pg
        """The torchft process group the manager reconfigures at each quorum."""
        self.pg = None  # no metadata collectives over the quorum (see ``sparse2d.ft``)
        self._queued: list[torch.Tensor] = []  # averages waiting for the step's all-reduce
        self._sent: Callable[[], None] | None = None  # the all-reduce carrying them
        self.arena = SendArena()
        """The step's send buffer; the engine gathers the sync's copies into it (its pool)."""
        self.held: list[InFlight] = []
        """Blocking parts of this step's sync, in the order they started (MC merge first)."""
        self.settles: Callable[[], object] | None = None
        """Lands a pending vote (``FaultTolerance.land``): run before a point that lands
        everything (the next sync, a surface, ``finish``, ``close``)."""
        self.sent_aside = False
        """Values went over the quorum outside ``start_tensors`` since the caller last reset
        this (a blocking average, a sum, a gather): a scan of its flat buffers alone would
        not cover everything sent."""

    @property
    def size(self) -> int:
        """Groups in the current quorum."""
        return int(self._participants())

    def start(
        self, buffers: list[torch.Tensor], hook: AllReduceHook | None = None, async_op: bool = True
    ) -> list[Any]:
        """Average ``buffers`` in place over the quorum; torchft divides by its participants.

        Asynchronous averages are queued, not sent: they travel with the step's dense
        gradients and control vector in ONE all-reduce per dtype (``start_tensors``), so a
        step pays one cross-group latency, not three. Waiting on the returned reduction
        first sends whatever is queued (a dropped part drains the same way).

        A user all-reduce hook is written for a torch process group and cannot ride torchft's
        managed one, so it is refused where the fault-tolerant sync is built."""
        if not async_op:
            self.sent_aside = True
            self._send(buffers)()
            return []
        self._queued.extend(buffers)
        return [_Flush(self)]

    @property
    def holding(self) -> bool:
        """Parts of this step's sync wait for its vote."""
        return bool(self.held)

    def hand(self, part: InFlight) -> None:
        """Keep a blocking part until the step's vote."""
        self.held.append(part)

    def settle(self) -> None:
        if self.settles is not None:
            self.settles()

    def commit(self) -> None:
        """The step committed: write the held averages back into the shards."""
        held, self.held = self.held, []
        for part in held:
            part.land()

    def discard(self) -> None:
        """The step failed its commit: drop the held averages (each replica keeps its own)."""
        held, self.held = self.held, []
        for part in held:
            part.drop()

    def all_gather(self, tensor: torch.Tensor) -> tuple[list[torch.Tensor], int]:
        """Every quorum member's ``tensor`` (same shape everywhere) and this group's index,
        as one SUM all-reduce over a zeroed slot per member (torchft's group has no
        all-gather); the MC identity merge uses it."""
        me = int(self.manager.participating_rank() or 0)
        slots = torch.zeros((self.size, *tensor.shape), dtype=tensor.dtype)
        slots[me] = tensor
        self.sum(slots)
        return list(slots.unbind(0)), me

    def sum(self, tensor: torch.Tensor) -> None:
        """SUM ``tensor`` in place over the quorum, blocking."""
        self.sent_aside = True
        self._start(tensor, average=False).wait()

    def any(self, flags: torch.Tensor) -> torch.Tensor:
        """Element-wise OR over the quorum of 0/1 ``uint8`` ``flags`` (a MAX all-reduce
        done as a SUM, torchft's reduction, then ``> 0``), blocking; flags are not modified."""
        wide = flags if self.size < 256 else flags.to(torch.int32)  # a uint8 sum overflows
        total = wide.clone()
        self.sum(total)
        return total > 0

    @property
    def failed(self) -> bool:
        """A collective of this step failed (torchft recorded it; its results are garbage):
        use nothing that came back from the quorum."""
        return self.manager.errored() is not None

    def start_tensors(
        self,
        tensors: list[torch.Tensor],
        before_send: Callable[[list[torch.Tensor]], None] | None = None,
    ) -> Callable[[], None]:
        """Start averaging ``tensors`` (any shapes) together with every queued average, in
        one all-reduce per dtype (as DDP buckets gradients); the returned call waits and
        writes the averages into them (and into the queued buffers).

        For values that are not live state (dense gradients, stepped on only once the step
        is accepted), the step's control vector and the sync's copies. ``before_send`` gets
        the buffers about to be sent, one per dtype (the queued averages, then ``tensors``,
        in order: the last of ``tensors`` of a dtype ends its buffer): one scan of them
        covers all of it, and a flag may still be set in them."""
        queued, self._queued = self._queued, []
        finish = self._send(queued + tensors, before_send, arena=True)
        self._sent = finish if queued else self._sent
        return finish

    def flush(self) -> None:
        """Send what is queued, if anything, and wait for it (a reduction's ``wait``)."""
        if self._queued:
            self.start_tensors([])
        sent, self._sent = self._sent, None
        if sent is not None:
            sent()

    def _send(
        self,
        tensors: list[torch.Tensor],
        before_send: Callable[[list[torch.Tensor]], None] | None = None,
        arena: bool = False,
    ) -> Callable[[], None]:
        """One all-reduce per dtype over ``tensors`` (a dtype's single tensor in place; else
        one flat buffer: ``arena``, the step's send buffer, where the queued copies already
        sit, or a fresh one); the returned call waits and writes back (once)."""
        sends = [self._flat(group, arena) for group in by_dtype(tensors).values()]
        if arena:
            self.arena.reset()
        flats = [flat for flat, _, _ in sends]
        if before_send is not None:
            before_send(flats)
        works = [self._start(flat, average=True) for flat in flats]
        done = False

        def finish() -> None:
            nonlocal done
            if done:
                return
            done = True
            for work in works:
                work.wait()
            with torch.no_grad():
                for flat, rest, offset in sends:
                    if not rest:  # averaged where they are
                        continue
                    tail = flat[offset : offset + sum(t.numel() for t in rest)]
                    for tensor, value in zip(
                        rest, _unflatten_dense_tensors(tail, rest), strict=True
                    ):
                        tensor.copy_(value)

        return finish

    def _flat(
        self, group: list[torch.Tensor], arena: bool
    ) -> tuple[torch.Tensor, list[torch.Tensor], int]:
        """``(the buffer sending group, the tensors copied into it, where they start)``: the
        rest sit in it already (a dtype's single tensor; the copies in the send buffer)."""
        if len(group) == 1:
            return group[0], [], 0
        placed = self.arena.place(group) if arena else None
        if placed is None:
            return _flatten_dense_tensors(group), group, 0
        flat, inside = placed
        start = offset = sum(t.numel() for t in group[:inside])
        with torch.no_grad():
            for tensor in group[inside:]:
                flat[offset : offset + tensor.numel()].copy_(tensor.reshape(-1))
                offset += tensor.numel()
        return flat, group[inside:], start

    def _start(self, tensor: torch.Tensor, average: bool) -> _QuorumWork:
        """Start SUMming (``average``: then dividing by the participants) ``tensor`` in place
        over the quorum, on torchft's process group itself. What ``Manager.allreduce`` does
        (no collective after an error, zeros from a group not participating, an error
        reported to the manager, never raised), without its per-call future chain and timeout
        timer: the wait ends at the budget's deadline (``WaitBudget.deadline``, ``wait_by``)."""
        manager = self.manager
        if manager.errored() is not None:  # the step fails its vote: the result is not used
            return _QuorumWork(manager, None, tensor, None, 0.0, 0.0)
        if not manager.is_participating():
            tensor.zero_()
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.SUM
        divisor = self._participants() if average else None
        try:
            work = self.quorum_pg.allreduce([tensor], opts)
        except Exception as error:
            manager.report_error(error)
            work = None
        wait_s = self.budget.seconds()
        deadline = self.budget.counted_from(time.monotonic()) + wait_s
        return _QuorumWork(manager, work, tensor, divisor, deadline, wait_s)


class WaitBudget:
    """How long a cross-group wait (the quorum's setup, the step's all-reduce, the commit
    echo) gives a silent peer: ``fault_tolerance.timeout_s`` less what a survivor still does once it gives up, so
    that a partition stalls survivors at most ``timeout_s`` plus the one step they redo
    (issue 64). Between its last commit and the step it redoes, a survivor also runs the
    failed step's work before its all-reduce (up to a step), waits for the groups whose step
    started later (up to a step: the groups' steps are that far apart when one committed a
    step another failed) and regroups (a quorum RPC and a new process group). Waiting the
    whole ``timeout_s`` from the all-reduce's start, survivors stalled 20.07-20.11 s against
    the 20.04 s bound on the emulated cluster (``bench/chaos.py``'s three seeds,
    ``bench/results/chaos.json`` at commit 77d15ae).

    The reserve is measured, not guessed: two median steps between this rank's commits plus
    ``REGROUP_S``, at most ``MAX_RESERVE_SHARE`` of ``timeout_s`` (a step that long is not
    what a partition's bound is about; the peer still gets 90% of its time)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        """``fault_tolerance.timeout_s``."""
        self._gaps: deque[float] = deque(maxlen=STEPS_MEASURED)
        self._last: float | None = None
        self._began: float | None = None

    def begin_step(self) -> None:
        """The step's cross-group waits count from now (its start, and again after its
        quorum) until ``end_step``: one wait for the whole step, however its waits follow one
        another on the group's ranks. Counted per wait, a rank waited out its commit echo
        while its peer waited for it in the group's lease agreement, then sent the step's
        all-reduce toward the cut peer with a fresh wait (the survivors back only after the
        link came back, ``bench/chaos.py`` seed 3)."""
        self._began = time.monotonic()

    def end_step(self) -> None:
        """Waits outside a step (a checkpoint's, a final sync's) count from their own start."""
        self._began = None

    def counted_from(self, started: float) -> float:
        """Where a cross-group wait begun at ``started`` counts from (``time.monotonic()``):
        the step's start inside a step, else ``started``; it ends ``seconds()`` later."""
        return started if self._began is None else self._began

    def committed(self, now: float) -> None:
        """A step committed at ``now`` (``time.monotonic()``)."""
        if self._last is not None:
            self._gaps.append(now - self._last)
        self._last = now

    @property
    def step_s(self) -> float:
        """The median seconds between this rank's last ``STEPS_MEASURED`` commits (0 before
        two): a stall is one gap among them, so it moves the median by at most one place."""
        return statistics.median(self._gaps) if self._gaps else 0.0

    def seconds(self) -> float:
        """How long a cross-group wait that starts now may take."""
        reserve = min(2 * self.step_s + REGROUP_S, MAX_RESERVE_SHARE * self.timeout_s)
        return self.timeout_s - reserve


STEPS_MEASURED = 32
"""Commits whose gaps the median step is taken over."""
REGROUP_S = 0.1
"""Seconds kept for the regroup: the quorum RPC, the new process group and, for a group that
failed a step another committed, a one-step heal (``bench/chaos.py``'s partitions on the
emulated cluster; torchft's lighthouse forms the quorum as soon as the last live group asks)."""
MAX_RESERVE_SHARE = 0.1
"""The reserve never takes more than this share of ``timeout_s``."""


TRUSTED_SHARE = 0.75
"""A cross-group all-reduce done later than this share of its wait fails its step. A
peer that started it up to that wait x (1 - share) earlier may have reached its own
deadline and gone on without this group (``manager.drop_process_group`` leaves the
abandoned collective running); completed here later, it would commit a step the peer then
commits again with other weights (split brain). Steps are in lockstep within milliseconds."""


def wait_by(work: Any, deadline: float, what: str) -> None:
    """``work.wait()``, given up at ``deadline`` (``time.monotonic()``) with ``TimeoutError``.

    Explicit: gloo's own timeout did not end a collective whose peer's link was cut (no reset
    arrives); on the emulated cluster a 30 s partition held the survivors' step all-reduce
    until the link was back (33 s with ``timeout_s=20``). Never ``wait(0)``: c10d reads a
    0 timeout as "none"."""
    left_ms = int((deadline - time.monotonic()) * 1000)
    if left_ms > 0:
        work.wait(datetime.timedelta(milliseconds=left_ms))
    elif not work.is_completed():
        raise TimeoutError(f"{what} not done by its deadline")
    else:
        work.wait()  # done: raises its error, if any


class _QuorumWork:
    """A started quorum all-reduce; ``wait`` reports an error to the manager, never raises."""

    def __init__(
        self,
        manager: Any,
        work: Any,
        tensor: torch.Tensor,
        divisor: int | None,
        deadline: float,
        wait_s: float,
    ) -> None:
        self.manager, self.work, self.tensor, self.divisor = manager, work, tensor, divisor
        self.deadline, self.wait_s = deadline, wait_s
        """``wait_s`` (``WaitBudget.seconds``) after the step began (``counted_from``), on
        ``time.monotonic()``."""

    def wait(self) -> bool:
        if self.work is None:
            return True
        work, self.work = self.work, None
        try:
            wait_by(work, self.deadline, "cross-group all-reduce")
        except Exception as error:
            self.manager.report_error(error)
            return True
        left = self.deadline - time.monotonic()
        if left < self.wait_s * (1 - TRUSTED_SHARE):  # a peer may have given up on it
            late = TimeoutError(f"cross-group all-reduce done {left:.1f} s before its deadline")
            self.manager.report_error(late)
            return True
        if self.divisor is not None:
            self.tensor.div_(self.divisor)
        return True


class _Flush:
    """A queued average's wait handle: sends the queue if nobody did, then waits."""

    def __init__(self, channel: ManagedChannel) -> None:
        self.channel = channel

    def wait(self) -> bool:
        self.channel.flush()
        return True


GROWTH = 8
"""A regrown buffer keeps 1/8 spare, so touched-row payloads that vary by a few rows from
step to step do not reallocate it every step."""


class SendArena:
    """One flat send buffer per dtype: the payload's regions first, the step's tail behind."""

    def __init__(self) -> None:
        self._flat: dict[torch.dtype, torch.Tensor] = {}
        self._cursor: dict[torch.dtype, int] = {}
        """Elements handed out since the last send, per dtype."""
        self._last: dict[torch.dtype, tuple[int, int]] = {}
        """The last send's elements in regions and behind them (gradients, control vector):
        the first region a step takes cuts the buffer to their sum, so that a payload of
        several regions does not outgrow it half way."""
        self.placed = 0
        """Sends that found the regions in place (the copies were not copied again)."""

    def take(
        self, key: object, numel: int, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """The next ``numel`` elements of ``dtype``'s buffer (``BufferPool.take``'s
        signature; ``key`` is unused: regions follow each other in the order taken)."""
        start = self._cursor.get(dtype, 0)
        regions, tail = self._last.get(dtype, (0, 0))
        need = max(start + numel, regions) + tail
        flat = self._flat.get(dtype)
        if flat is None or flat.numel() < need or flat.device != device:
            spare = 0 if flat is None else need // GROWTH
            flat = self._flat[dtype] = torch.empty(need + spare, dtype=dtype, device=device)
        self._cursor[dtype] = start + numel
        return flat[start : start + numel]

    def place(self, group: list[torch.Tensor]) -> tuple[torch.Tensor, int] | None:
        """Where to send ``group`` (tensors of one dtype, in send order): the arena's flat
        buffer cut to their total and how many leading tensors already sit in it, when those
        are exactly the regions handed out since the last send; None otherwise (the caller
        flattens into a fresh buffer). The sizes are remembered for the next ``take``."""
        dtype = group[0].dtype
        flat, cursor = self._flat.get(dtype), self._cursor.get(dtype, 0)
        if flat is None:
            return None
        total = sum(t.numel() for t in group)
        self._last[dtype] = (cursor, max(total - cursor, 0))
        element, base = flat.element_size(), flat.data_ptr()
        offset = inside = 0
        for tensor in group:
            if offset == cursor:
                break
            at = base + offset * element
            if (
                tensor.device != flat.device
                or tensor.data_ptr() != at
                or not tensor.is_contiguous()
            ):
                return None
            offset += tensor.numel()
            inside += 1
        if offset != cursor:
            return None
        if flat.numel() < total:
            return None
        self.placed += inside > 0
        return flat[:total], inside

    def reset(self) -> None:
        """The step's send started: the next payload's regions start at the front again."""
        self._cursor.clear()

    def forget(self) -> None:
        """A send failed and was abandoned (``manager.drop_process_group``): it may still write
        into its buffer when a cut link comes back, so the next payload gets new buffers."""
        self._flat.clear()
        self._cursor.clear()
