"""Small collectives: where their tensors (votes, flags, metrics) live, and one answer for all.

They are built on the CPU. A group made with ``"nccl"`` alone (what a TorchRec user passes
to ``init_process_group``) moves CUDA tensors only: a CPU tensor fails with "No backend type
associated with device type cpu" (the trainer's first CUDA run, bench/RESULTS.md, CUDA).
``gloo`` and ``"cpu:gloo,cuda:nccl"`` groups move CPU tensors. Each such collective puts
its tensor on ``flag_device(pg)``. What one rank decides for all (a plan, the advisor's
pick) is ``share_from_rank0``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


def flag_device(pg: dist.ProcessGroup | None = None) -> torch.device:
    """This rank's GPU when ``pg`` (default: the world) runs NCCL alone, else the CPU."""
    if dist.is_available() and dist.is_initialized() and str(dist.get_backend(pg)) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def share_from_rank0(compute: Callable[[], Any], pg: dist.ProcessGroup | None) -> Any:
    """``compute()`` on rank 0 of ``pg`` (picklable), broadcast; its error raised on every rank."""
    result: list[Any] = [None]
    if dist.get_rank(pg) == 0:
        try:
            result[0] = compute()
        except Exception as error:  # forwarded to every rank below
            result[0] = error
    dist.broadcast_object_list(
        result, src=dist.get_global_rank(pg or dist.group.WORLD, 0), group=pg
    )
    if isinstance(result[0], Exception):
        raise result[0]
    return result[0]
