"""The fault-tolerant step's send buffer, which the sync's copies are gathered straight into.

Under fault tolerance a step sends ONE all-reduce per dtype: the sync's copies (queued by
the engine's payload), then the dense gradients and the control vector
(``ManagedChannel.start_tensors``). Gathering the copies into buffers of their own and then
flattening them with the gradients into a fresh send buffer (and back out after the
all-reduce) costs two extra passes over every embedding row synced and a second
payload-sized allocation at the peak. ``SendArena`` removes both: it is the engine's
``BufferPool``, handing out the copies' buffers as consecutive regions at the front of one
flat buffer per dtype, with room behind them for the gradients and the control vector.
The copies are then averaged where they are; only the small tail is copied in and out.

Regions live until the sync parts held in them have landed or been dropped (the next step's
payload reuses them), which is when ``BufferPool``'s buffers were free as well. Anything the
arena cannot place exactly (another layout, a region handed out before the buffer grew, a
payload not built by the engine) is sent through a fresh flat buffer as before.
"""

from __future__ import annotations

import torch

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
