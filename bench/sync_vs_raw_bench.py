"""Dense replica sync vs a raw ``allreduce_coalesced`` of the same bytes, 1 MB and up.

World 4 gloo CPU ranks, L=2 (2 replicas), per size two table-wise tables of
``rows x 64`` fp32 with EXACT_SGD (weights only, so the payload is exactly the
size per rank). Per repetition, interleaved: *raw* = ``replica_pg.allreduce_coalesced``
(AVG) of the live weight views; *sync* = ``SyncPolicy.sync_now`` with the dense
engine (gather into one buffer, all-reduce, scatter back). Medians over
repetitions, slowest rank. *Loopback limit*: a plain TCP stream between two
ranks on 127.0.0.1 measures the host's loopback bandwidth; a ring all-reduce
over 2 replicas sends and receives the payload once per rank, so payload /
bandwidth is a floor for both (both replica pairs share the link and the cores).

The default sizes stop at 256 MB: at 1 GB each of the 4 processes holds the table,
the sync buffer and gloo's coalescing copy (~3 GB each, 12 GB in all), more than
this shared 24 GiB machine can spare; pass ``--sizes ... 1024`` on a larger host.

Run: ``.venv/bin/python bench/sync_vs_raw_bench.py`` (about 3 minutes). Writes the
``sync-vs-raw`` section of ``bench/RESULTS.md`` and ``bench/results/sync_vs_raw.json``.
"""

from __future__ import annotations

import argparse
import socket
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from bench_util import RESULTS_DIR, publish, spawn, timed

HERE = Path(__file__).resolve().parent
WORLD, L, DIM, MB = 4, 2, 64, 1 << 20
SIZES_MB = (1, 4, 16, 64, 256)


def loopback_bytes_per_s(nbytes: int) -> float:
    """TCP throughput from rank 0 to rank 1 over 127.0.0.1 (collective on the world)."""
    rank = dist.get_rank()
    server = socket.create_server(("127.0.0.1", 0)) if rank == 0 else None
    port = [server.getsockname()[1] if server else 0]
    dist.broadcast_object_list(port, src=0)
    result = torch.zeros(1, dtype=torch.float64)
    chunk = 4 * MB
    if rank == 0 and server is not None:
        conn, _ = server.accept()
        payload = memoryview(bytearray(chunk))
        for _ in range(nbytes // chunk):
            conn.sendall(payload)
        conn.recv(1)
        conn.close()
        server.close()
    elif rank == 1:
        sock = socket.create_connection(("127.0.0.1", port[0]))
        buffer = bytearray(chunk)
        begin, received = time.perf_counter(), 0
        while received < (nbytes // chunk) * chunk:
            received += sock.recv_into(buffer)
        result[0] = received / (time.perf_counter() - begin)
        sock.sendall(b"x")
        sock.close()
    dist.all_reduce(result, op=dist.ReduceOp.MAX)
    return float(result)


def sync_vs_raw_rank(sizes_mb: list[int], reps: int, loopback_mb: int) -> dict[str, Any]:
    """On every rank: per size, median raw and sync seconds (slowest rank)."""
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    from sparse2d import DMPCollection
    from sparse2d.sync.policy import SyncOptions

    out: dict[str, Any] = {"loopback_Bps": loopback_bytes_per_s(loopback_mb * MB), "sizes": []}
    for size in sizes_mb:
        rows = size * MB // (DIM * 4)
        ebc = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(
                    name=f"t{i}", embedding_dim=DIM, num_embeddings=rows, feature_names=[f"f{i}"]
                )
                for i in range(L)
            ],
            device=torch.device("meta"),
        )
        _apply_optimizer_in_backward(torch.optim.SGD, ebc.parameters(), {"lr": 0.01})
        model = DMPCollection(
            torch.nn.ModuleDict({"ebc": ebc}),
            L,
            device="cpu",
            init_data_parallel=False,
            sync_options=SyncOptions(engine="dense"),
            constraints={
                f"t{i}": ParameterConstraints(sharding_types=["table_wise"]) for i in range(L)
            },
        )
        live = [s.weight for s in model.shard_states]
        nbytes = sum(t.numel() * t.element_size() for t in live)
        opts = dist.AllreduceCoalescedOptions()
        opts.reduceOp = dist.ReduceOp.AVG
        policy = model.sync_policy
        guard = policy.guard  # the NaN/inf guard (default on): also timed without it
        raw, synced, unguarded = [], [], []
        for rep in range(reps + 1):
            dist.barrier()
            begin = time.perf_counter()
            with torch.no_grad():
                model.replica_pg.allreduce_coalesced(live, opts).wait()
            raw_s = time.perf_counter() - begin
            dist.barrier()
            sync_s = model.sync().seconds
            dist.barrier()
            policy.guard = None
            bare_s = model.sync().seconds
            policy.guard = guard
            if rep:  # the first repetition warms up buffers and connections
                raw.append(raw_s)
                synced.append(sync_s)
                unguarded.append(bare_s)
        slowest = torch.tensor([raw, synced, unguarded], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        raw, synced, unguarded = slowest.tolist()
        out["sizes"].append(
            {
                "mb": size,
                "bytes": nbytes,
                "raw_s": sorted(raw)[reps // 2],
                "sync_s": sorted(synced)[reps // 2],
                "bare_s": sorted(unguarded)[reps // 2],
                "raw_all": raw,
                "sync_all": synced,
                "bare_all": unguarded,
            }
        )
        model.sync_policy.close()
        del model, live
    return out


def _markdown(r: dict[str, Any], args: argparse.Namespace, wall: float) -> str:
    bw = r["loopback_Bps"]
    lines = [
        "## Sync vs raw allreduce_coalesced of the same bytes, and vs the loopback limit",
        "",
        f"`bench/sync_vs_raw_bench.py` — world {WORLD} gloo CPU ranks, L={L} (2 replicas), "
        f"2 TW tables x {DIM} fp32 per size, EXACT_SGD (payload = weights), median of "
        f"{args.reps} interleaved repetitions, slowest rank. Loopback (TCP 127.0.0.1, one "
        f"stream, {args.loopback_mb} MB): {bw / 1e9:.2f} GB/s; floor = payload / loopback. "
        f"Capped at {max(args.sizes)} MB: 1 GB would need ~12 GB across the 4 processes on "
        f"this shared 24 GiB machine. {args.machine}; ratios are within one run. *sync* = "
        f"`model.sync()` as shipped (NaN/inf guard on: one scan of the payload and a job-wide "
        f"vote); *no guard* = the same sync with the guard off. Wall {wall:.0f} s.",
        "",
        "| MB/rank | raw ms | sync ms | sync / raw | no guard ms | no guard / raw "
        "| loopback floor ms | sync / floor |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in r["sizes"]:
        floor = s["bytes"] / bw
        lines.append(
            f"| {s['bytes'] / 1e6:.1f} | {1e3 * s['raw_s']:.2f} | {1e3 * s['sync_s']:.2f} | "
            f"{s['sync_s'] / s['raw_s']:.2f} | {1e3 * s['bare_s']:.2f} | "
            f"{s['bare_s'] / s['raw_s']:.2f} | {1e3 * floor:.2f} | {s['sync_s'] / floor:.1f} |"
        )
    lines += [
        "",
        f"Reproduce: `PYTHONPATH=. .venv/bin/python bench/sync_vs_raw_bench.py --sizes "
        f"{' '.join(map(str, args.sizes))}`.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES_MB), help="MB/rank")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--loopback-mb", type=int, default=256)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-results-md", action="store_true", help="do not edit RESULTS.md")
    args = parser.parse_args()
    result, wall = timed(
        args, spawn, WORLD, sync_vs_raw_rank, args.sizes, args.reps, args.loopback_mb
    )
    publish(args, result, _markdown(result, args, wall), "sync_vs_raw.json", "sync-vs-raw")


if __name__ == "__main__":
    main()
