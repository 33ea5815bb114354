"""The replica channel: where a replica sync's averages travel.

One sync (``SyncPolicy``: engines, NaN/inf guard, cadence, scaling) serves two transports:

- ``InWorldChannel``: the replica process group inside one torchrun world (2D as TorchRec
  builds it). Averages may land in place, and are written back as soon as they arrive.
- ``ManagedChannel``: torchft's managed process group across torchrun worlds (one world per
  sharding group); its members change between syncs.

A channel averages, and lands the blocking parts of a sync it is handed (``hand``,
``sync.landing``): now, or, a channel that ``holds`` (built outside ``sync``), when it
releases them; the sync never decides that. What is averaged (engines) and when (policy)
stay in the policy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from sparse2d.sync.landing import LandingPoint, Started
from sparse2d.sync.shards import by_dtype
from sparse2d.sync.transport.arena import SendArena
from sparse2d.sync.transport.collectives import AllReduceHook
from sparse2d.sync.transport.transfer import Reduction, start_average


class Channel:
    """How a channel lands the blocking parts it is handed: now. A subclass that ``holds``
    keeps them (their averages must then be copies, ``sync.plan``) and alone releases or
    drops them; ``settle`` lets it decide before a point that lands everything."""

    holds = False
    """Parts handed to it may wait in it."""
    members_change = False
    """Members may join between syncs with values of their own (a reset then assumes no row
    agrees)."""

    @property
    def size(self) -> int | None:
        """Replicas averaged, when it differs between syncs; None: the policy's own count."""
        return None

    @property
    def holding(self) -> bool:
        """Parts wait in it now."""
        return False

    def hand(self, started: Started) -> None:
        """Land a blocking part of the sync that started it."""
        started.land(LandingPoint.SYNC)

    def settle(self) -> None:
        """Decide what it holds before everything lands (a plain channel holds nothing)."""


class InWorldChannel(Channel):
    """The replica process group of this world: averages are applied when they arrive."""

    def __init__(self, pg: dist.ProcessGroup | None) -> None:
        self.pg = pg

    def start(
        self, buffers: list[torch.Tensor], hook: AllReduceHook | None, async_op: bool
    ) -> Reduction:
        """Average ``buffers`` in place over the replica group (``start_average``)."""
        return start_average(buffers, self.pg, hook, async_op)


class ManagedChannel(Channel):
    """torchft's managed process group: rank ``r`` of every group in the current quorum.
    Errors do not raise here: they are reported to torchft's manager (whoever built the
    channel decides what a failed collective means for the parts it holds)."""

    members_change = True

    def __init__(self, manager: Any, quorum_pg: Any, participants: Callable[[], int]) -> None:
        self.manager = manager
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
    ) -> Reduction:
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
            return Reduction([], lambda: buffers)
        self._queued.extend(buffers)
        return Reduction([_Flush(self)], lambda: buffers)

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
        timer: the process group's own timeout bounds a wait."""
        manager = self.manager
        if manager.errored() is not None:  # the step fails its vote: the result is not used
            return _QuorumWork(manager, None, tensor, None)
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
        return _QuorumWork(manager, work, tensor, divisor)


class _QuorumWork:
    """A started quorum all-reduce; ``wait`` reports an error to the manager, never raises."""

    def __init__(self, manager: Any, work: Any, tensor: torch.Tensor, divisor: int | None) -> None:
        self.manager, self.work, self.tensor, self.divisor = manager, work, tensor, divisor

    def wait(self) -> bool:
        if self.work is None:
            return True
        work, self.work = self.work, None
        try:
            work.wait()
        except Exception as error:
            self.manager.report_error(error)
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


ReplicaChannel = Channel
