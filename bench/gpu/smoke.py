"""First look at a GPU machine: versions, FBGEMM's CUDA ops, and which collectives gloo runs
on CUDA tensors (one GPU: NCCL refuses two ranks on one device, so the multi-rank checks of
``check.sh`` move CUDA tensors over gloo). Prints one JSON line."""

from __future__ import annotations

import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _collectives(rank: int, world: int, port: int, results: mp.Queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    x = torch.arange(4, dtype=torch.float32, device="cuda") + 10 * rank
    cases = {
        "all_reduce": lambda: dist.all_reduce(x.clone()),
        "broadcast": lambda: dist.broadcast(x.clone(), src=0),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(
            torch.empty(4 * world, device="cuda"), x
        ),
        "all_to_all_single": lambda: dist.all_to_all_single(torch.empty(4, device="cuda"), x),
        "all_to_all_single_splits": lambda: dist.all_to_all_single(
            torch.empty(4, device="cuda"), x, [2, 2], [2, 2]
        ),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(
            torch.empty(4 // world, device="cuda"), x
        ),
    }
    out = {}
    for name, fn in cases.items():
        try:
            fn()
            torch.cuda.synchronize()
            out[name] = "ok"
        except Exception as error:  # reported, not raised: the point is the table
            out[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
    results.put((rank, out))
    dist.destroy_process_group()


def main() -> None:
    import fbgemm_gpu
    import torchft
    import torchrec

    report = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "gpu": torch.cuda.get_device_name(0),
        "fbgemm_gpu": fbgemm_gpu.__version__,
        "torchrec": torchrec.__version__,
        "torchft": getattr(torchft, "__version__", "?"),
    }
    lengths = torch.tensor([1, 2, 0, 3], device="cuda")
    report["fbgemm_cumsum"] = torch.ops.fbgemm.asynchronous_complete_cumsum(lengths).tolist()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_collectives, args=(r, 2, port, results)) for r in range(2)]
    for p in procs:
        p.start()
    report["gloo_on_cuda"] = dict(results.get(timeout=120) for _ in procs)[0]
    for p in procs:
        p.join(timeout=30)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
