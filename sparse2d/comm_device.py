"""Where the small tensors of a collective (votes, flags, metrics) live.

They are built on the CPU. A group made with ``"nccl"`` alone (what a TorchRec user passes
to ``init_process_group``) moves CUDA tensors only: a CPU tensor fails with "No backend type
associated with device type cpu" (the trainer's first CUDA run, bench/RESULTS.md, CUDA).
``gloo`` and ``"cpu:gloo,cuda:nccl"`` groups move CPU tensors. Each such collective puts
its tensor on ``flag_device(pg)``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def flag_device(pg: dist.ProcessGroup | None = None) -> torch.device:
    """This rank's GPU when ``pg`` (default: the world) runs NCCL alone, else the CPU."""
    if dist.is_available() and dist.is_initialized() and str(dist.get_backend(pg)) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
