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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from sparse2d.sync.collectives import AllReduceHook
from sparse2d.sync.overlap import Reduction, start_average


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
    ) -> Reduction:
        """Start averaging ``buffers`` (values at stable positions); ``wait`` gives new values."""
        if (key, 0) not in self._slots:
            return self._first(key, buffers, pg, hook, async_op)
        slots = [self._slots[(key, i)] for i in range(len(buffers))]
        sent: list[torch.Tensor] = []
        for buffer, slot in zip(buffers, slots, strict=True):
            if buffer.shape != slot.ref.shape or buffer.dtype != torch.float32:
                raise RuntimeError(
                    f"bf16 sync of {key!r}: payload {tuple(buffer.shape)} {buffer.dtype} does not "
                    f"match the reference {tuple(slot.ref.shape)} float32; bf16 compression "
                    "needs stable fp32 positions (dense engine)."
                )
            delta = buffer.sub_(slot.ref).add_(slot.residual)  # the payload copy is ours
            quantized = delta.to(torch.bfloat16)
            torch.sub(delta, quantized.float(), out=slot.residual)
            sent.append(quantized)
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


def _ordered_mean(gathered: torch.Tensor) -> torch.Tensor:
    """fp32 mean over replicas summed in replica order: identical on every replica."""
    rows = gathered.float()
    total = rows[0].clone()
    for row in rows[1:]:
        total.add_(row)
    return total.div_(gathered.shape[0])
