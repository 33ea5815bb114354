"""bf16 delta compression with error feedback for replica sync.

Each replica keeps, per payload buffer, an fp32 reference ``ref`` of the values
the last sync produced (identical on every replica) and a local ``residual``.
A sync sends ``q = bf16(live - ref + residual)`` and keeps
``residual = (live - ref + residual) - q`` (error feedback: what rounding drops
is sent next time, so drift does not accumulate). The replicas all-gather the
bf16 deltas and sum them in fp32 in replica order, so every replica computes the
same ``ref + mean(q)`` bit for bit. Bytes on the wire are half of fp32's per
replica; all-gather traffic grows with the number of replicas G, which is small
(replicas of one sharding group, typically <= 8).

Positions must be stable between syncs (the dense engine's are); the policy
rejects bf16 with engines whose positions change.

Under fault tolerance (``ManagedChannel``: torchft's group, all-reduce only) the bf16
deltas are SUMmed by one bf16 all-reduce (half of fp32's bytes, at any number of
groups) and divided by the quorum size in fp32. Each replica's own rounding is fed back
as above; the rounding of the sum itself (at most 2^-8 relative per addition) is not,
since no replica sees the others' deltas, but it is the same on every replica, so they
stay identical. A flag rides at the end of the first buffer: a member without a
reference (the first sync, after a dropped sync part or a heal) sends zeros and sets it,
and then every member averages ``ref + delta`` (its values plus its unsent residual)
exactly in fp32 and restarts its references from that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from sparse2d.sync.transport.collectives import AllReduceHook
from sparse2d.sync.transport.transfer import Reduction, start_average

if TYPE_CHECKING:
    from sparse2d.sync.transport.channel import ManagedChannel


@dataclass(slots=True)
class _Slot:
    ref: torch.Tensor
    residual: torch.Tensor


class Bf16DeltaCompressor:
    """Sends bf16 deltas since the last sync; keeps fp32 references and residuals."""

    def __init__(self) -> None:
        self._slots: dict[tuple[str, int], _Slot] = {}

    def wire_bytes(self, key: str, buffers: list[torch.Tensor]) -> int:
        """Bytes this replica sends for ``buffers`` (fp32 on the first sync of ``key``)."""
        if (key, 0) not in self._slots:
            return sum(b.numel() * b.element_size() for b in buffers)
        return sum(b.numel() * 2 for b in buffers)

    def reset(self) -> None:
        """Forget references (after loading a checkpoint or re-aligning replicas)."""
        self._slots.clear()

    def start(
        self,
        key: str,
        buffers: list[torch.Tensor],
        pg: dist.ProcessGroup,
        hook: AllReduceHook | None = None,
        async_op: bool = False,
        channel: ManagedChannel | None = None,
    ) -> Reduction:
        """Start averaging ``buffers`` (values at stable positions); ``wait`` gives new values.

        ``channel``: torchft's managed group instead of ``pg`` (fault tolerance)."""
        if channel is not None:
            return self._start_managed(key, buffers, channel)
        if (key, 0) not in self._slots:
            return self._first(key, buffers, pg, hook, async_op)
        slots = [self._slots[(key, i)] for i in range(len(buffers))]
        sent = [_quantize(key, buffer, slot) for buffer, slot in zip(buffers, slots, strict=True)]
        if hook is not None:
            for q in sent:
                hook([q], pg)
            return Reduction([], lambda: self._land(slots, sent))
        group = dist.get_world_size(pg)
        gathered = [q.new_empty(group * q.numel()) for q in sent]
        works = [
            dist.all_gather_into_tensor(out, q, group=pg, async_op=True)
            for out, q in zip(gathered, sent, strict=True)
        ]

        def finish() -> list[torch.Tensor]:
            means = [_ordered_mean(g.view(group, -1)).view_as(q) for g, q in zip(gathered, sent)]
            return self._land(slots, means)

        reduction = Reduction(works, finish)
        if not async_op:
            values = reduction.wait()
            return Reduction([], lambda: values)
        return reduction

    def _start_managed(
        self, key: str, buffers: list[torch.Tensor], channel: ManagedChannel
    ) -> Reduction:
        """bf16 deltas SUMmed over torchft's quorum (see the module docstring). Blocking:
        every collective runs before the part is handed to its channel; the references
        advance only when the part lands (``sync.landing``)."""
        unchanged = Reduction([], lambda: buffers)  # a failed collective's: never written back
        if not buffers:
            return unchanged
        slots = [self._slots.get((key, i)) for i in range(len(buffers))]
        have = all(slot is not None for slot in slots)
        wires = []
        for i, (buffer, slot) in enumerate(zip(buffers, slots, strict=True)):
            wire = torch.zeros(buffer.numel() + (i == 0), dtype=torch.bfloat16)
            if have and slot is not None:
                wire[: buffer.numel()] = _quantize(key, buffer, slot)
            wires.append(wire)
        wires[0][-1] = 0.0 if have else 1.0  # "I have no reference": everyone restarts
        replicas = channel.size
        channel.start_sum(wires).wait()
        if channel.failed:  # garbage came back: the step's vote fails
            return unchanged
        if float(wires[0][-1]) == 0.0:
            means = [w[: b.numel()].float().div_(replicas) for w, b in zip(wires, buffers)]
            return Reduction([], lambda: self._land([s for s in slots if s], means))
        values = [  # own values plus unsent residual (buffer = live - ref + residual)
            b.add(s.ref) if have and s is not None else b.clone()
            for b, s in zip(buffers, slots, strict=True)
        ]
        channel.start(values, async_op=False)
        if channel.failed:
            return unchanged

        def restart() -> list[torch.Tensor]:
            for i, value in enumerate(values):
                self._slots[(key, i)] = _Slot(ref=value.clone(), residual=torch.zeros_like(value))
            return values

        return Reduction([], restart)

    def _first(
        self,
        key: str,
        buffers: list[torch.Tensor],
        pg: dist.ProcessGroup,
        hook: AllReduceHook | None,
        async_op: bool,
    ) -> Reduction:
        """No shared reference yet: average exactly once, then remember the result."""
        inner = start_average(buffers, pg, hook, async_op)

        def finish() -> list[torch.Tensor]:
            values = inner.wait()
            for i, value in enumerate(values):
                self._slots[(key, i)] = _Slot(
                    ref=value.float().clone(), residual=torch.zeros_like(value, dtype=torch.float32)
                )
            return values

        return Reduction([], finish)

    def _land(self, slots: list[_Slot], means: list[torch.Tensor]) -> list[torch.Tensor]:
        """Advance the shared references by the mean deltas; they are the new values."""
        for slot, mean in zip(slots, means, strict=True):
            slot.ref.add_(mean)
        return [slot.ref for slot in slots]


def _quantize(key: str, buffer: torch.Tensor, slot: _Slot) -> torch.Tensor:
    """``bf16(buffer - ref + residual)``; the residual keeps what the rounding dropped.
    Leaves ``buffer`` holding the unrounded delta (the payload copy is ours)."""
    if buffer.shape != slot.ref.shape or buffer.dtype != torch.float32:
        raise RuntimeError(
            f"bf16 sync of {key!r}: payload {tuple(buffer.shape)} {buffer.dtype} does not "
            f"match the reference {tuple(slot.ref.shape)} float32; bf16 compression "
            "needs stable fp32 positions (dense engine)."
        )
    delta = buffer.sub_(slot.ref).add_(slot.residual)
    quantized = delta.to(torch.bfloat16)
    torch.sub(delta, quantized.float(), out=slot.residual)
    return quantized


def _ordered_mean(gathered: torch.Tensor) -> torch.Tensor:
    """fp32 mean over replicas summed in replica order: identical on every replica."""
    rows = gathered.float()
    total = rows[0].clone()
    for row in rows[1:]:
        total.add_(row)
    return total.div_(gathered.shape[0])
