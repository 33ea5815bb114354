"""Selected rows of many tensors packed into one contiguous buffer per dtype, and back.

What the touched-row engines send (``engines.sparse``, ``engines.auto``): the union rows of
each weight and of every optimizer state (row-wise ``(rows,)`` or element-wise
``(rows, cols)``, full width), gathered straight into the buffer; ``scatter`` writes the
averaged rows back.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from sparse2d.errors import ConfigError
from sparse2d.sync.engines.base import BufferPool, Payload


def row_bytes(tensor: torch.Tensor) -> int:
    return row_numel(tensor) * tensor.element_size()


def row_payload(
    entries: list[tuple[torch.Tensor, torch.Tensor | None]],
    tail: torch.Tensor | None = None,
    on_tail: Callable[[torch.Tensor], None] | None = None,
    pool: tuple[BufferPool, object] | None = None,
) -> Payload:
    """One contiguous buffer per dtype of the selected rows (all rows where ``None``).

    Rows are gathered straight into the buffer (``index_select(out=...)``): one copy.
    ``tail`` (fp32, needs an fp32 entry) rides at the end of the fp32 buffer: it is averaged
    with the rows at no extra collective, never written to a shard, and ``scatter`` hands its
    averaged value to ``on_tail``.
    """
    groups: dict[torch.dtype, list[tuple[torch.Tensor, torch.Tensor | None, int, int]]] = {}
    sizes: dict[torch.dtype, int] = {}
    for tensor, rows in entries:
        count = tensor.shape[0] if rows is None else rows.numel()
        n = count * row_numel(tensor)
        offset = sizes.get(tensor.dtype, 0)
        groups.setdefault(tensor.dtype, []).append((tensor, rows, offset, count))
        sizes[tensor.dtype] = offset + n
    if tail is not None and torch.float32 not in sizes:
        raise ConfigError(
            "a payload tail rides on the fp32 buffer; this payload has none: pass tail=None "
            "or include an fp32 tensor in entries"
        )
    extra = {torch.float32: tail.numel()} if tail is not None else {}

    def gather(pooled: bool = False) -> list[torch.Tensor]:
        buffers = []
        for dtype, group in groups.items():
            numel, device = sizes[dtype] + extra.get(dtype, 0), group[0][0].device
            flat = (
                pool[0].take(pool[1], numel, dtype, device)
                if pooled and pool is not None
                else torch.empty(numel, dtype=dtype, device=device)
            )
            if all(rows is None for _, rows, _, _ in group):  # whole tensors: one concatenation
                parts = [tensor.reshape(-1) for tensor, *_ in group]
                if dtype in extra and tail is not None:
                    parts.append(tail.to(dtype))
                buffers.append(torch.cat(parts, out=flat))
                continue
            for tensor, rows, offset, count in group:
                chunk = flat[offset : offset + count * row_numel(tensor)]
                chunk = chunk.view(count, *tensor.shape[1:])
                if rows is None:
                    chunk.copy_(tensor)
                else:
                    torch.index_select(tensor, 0, rows, out=chunk)
            if dtype in extra and tail is not None:
                flat[sizes[dtype] :].copy_(tail)
            buffers.append(flat)
        return buffers

    def scatter(values: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for (dtype, group), flat in zip(groups.items(), values, strict=True):
                for tensor, rows, offset, count in group:
                    chunk = flat[offset : offset + count * row_numel(tensor)]
                    chunk = chunk.view(count, *tensor.shape[1:]).to(tensor.dtype)
                    if rows is None:
                        tensor.copy_(chunk)
                    else:
                        tensor.index_copy_(0, rows, chunk)
                if dtype in extra and on_tail is not None:
                    on_tail(flat[sizes[dtype] :].clone())

    return Payload(buffers=gather(pooled=True), scatter=scatter, gather=gather)


def row_numel(tensor: torch.Tensor) -> int:
    return tensor.numel() // max(tensor.shape[0], 1)
