"""TorchRec's reduce-scatter-v backward all-gathers uneven blocks, which gloo refuses.

Upstream: torchrec/distributed/comm_ops.py:2667 (``ReduceScatterV_Wait.backward``, the
``dist.all_gather`` of a gradient split unevenly across ranks).
Issue: none found in TorchRec (searched: ReduceScatterV backward, all_gather uneven, gloo);
the cause is gloo's equal-block all_gather, https://github.com/pytorch/pytorch/issues/156627.
Without it: the backward of a row-wise (or TWRW) table fails on CPU ("invalid tensor size")
whenever ranks see different batch sizes, TorchRec's own 1D DMP included.
Probe: ``needed()`` reads the upstream backward's source for ``dist.all_gather(`` (running it
needs a gloo group of two ranks with uneven splits: too dear for a probe).
Fix: on gloo with uneven splits only, gather blocks padded to the largest split (blocking)
and keep each rank's rows; equal splits and every other backend go to TorchRec.
Regression test: ``tests/test_patches_torchrec_comm.py`` (row-wise, a batch size per rank).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from sparse2d.patches._base import Patch, is_patched, mark, original_of

_SITE = "torchrec.distributed.comm_ops:ReduceScatterV_Wait.backward"


class _Completed:
    """A finished request: what TorchRec's ``Request.req.wait()`` expects."""

    def wait(self) -> bool:
        return True


def _uneven_all_gather_on_gloo(original: Callable[..., Any]) -> Callable[..., Any]:
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        import torch.distributed as dist

        rsi = ctx.myreq.rsi
        if rsi.equal_splits or dist.get_backend(ctx.pg) != "gloo":
            return original(ctx, grad_output)
        if rsi.codecs is not None:
            grad_output = rsi.codecs.backward.encode(grad_output)
        grad_input = grad_output.new_empty(rsi.total_input_size)
        splits = list(rsi.input_splits)
        padded = grad_output.new_zeros((max(splits), *grad_output.shape[1:]))
        padded[: grad_output.shape[0]].copy_(grad_output)
        blocks = [torch.empty_like(padded) for _ in splits]
        dist.all_gather(blocks, padded, group=ctx.pg)
        for out, block, rows in zip(torch.split(grad_input, splits), blocks, splits, strict=True):
            out.copy_(block[:rows])
        ctx.myreq.req = _Completed()
        ctx.myreq.tensor = grad_input
        return (None, None, ctx.myreq.dummy_tensor)

    return mark(backward, original)


def needed() -> bool:
    """Whether TorchRec's backward still all-gathers uneven splits with ``dist.all_gather``."""
    from torchrec.distributed import comm_ops

    try:
        return "dist.all_gather(" in inspect.getsource(
            original_of(comm_ops.ReduceScatterV_Wait.backward)
        )
    except (OSError, TypeError):
        return False


def apply() -> None:
    """Replace the backward on gloo (idempotent; nothing while TorchRec no longer needs it)."""
    from torchrec.distributed import comm_ops

    wait = comm_ops.ReduceScatterV_Wait
    if not is_patched(wait.backward) and needed():
        wait.backward = staticmethod(_uneven_all_gather_on_gloo(wait.backward))  # type: ignore[method-assign]


PATCHES = (
    Patch(
        name="torchrec_comm_ops",
        upstream="torchrec/distributed/comm_ops.py:2667",
        issue="https://github.com/pytorch/pytorch/issues/156627",
        breaks="row-wise/TWRW backward with a different batch size per rank fails on gloo",
        probe="source of ReduceScatterV_Wait.backward still calls dist.all_gather",
        needed=needed,
        apply=apply,
        sites=(_SITE,),
        devices=("cpu",),  # gloo, the CPU backend; NCCL gathers uneven blocks
    ),
)
