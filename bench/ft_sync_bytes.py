"""Bytes per replica sync under fault tolerance: the touched-row engine vs the dense engine.

Two torchft groups (each its own one-rank gloo world, an in-process lighthouse), one
100,000 x 16 table with row-wise AdaGrad (weights and accumulators travel), Zipf-distributed
ids (exponent 1.05, 256 lookups per group and step), a sync every step. The bytes are what
the sync hands to torchft's all-reduces (``ManagedChannel._start`` and ``start`` are wrapped
and count every tensor they are given, queued averages included, while ``sync_embeddings``
runs: the agreement's counts, ids or bitmaps, and the payload), not a formula. The dense
gradients and the step's control vector are the same in both runs and not counted.

    PYTHONPATH=. python bench/ft_sync_bytes.py           # writes the ft_sync_bytes section

``--send-buffer``: the dense engine's step (``sync_embeddings`` + ``finish_step``) with the
sync's copies gathered into the step's send buffer (``sparse2d.ft.transport``, the
default) vs into buffers of their own that the channel flattens into a fresh send buffer
and copies back out (the code before it), alternated in one run on a larger table; section
``ft_send_buffer``.

    PYTHONPATH=. python bench/ft_sync_bytes.py --send-buffer --rows 1000000 --rounds 4
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from bench_util import RESULTS_DIR, publish, rendezvous_env

HERE = Path(__file__).resolve().parent
ROWS, DIM, LOOKUPS, ZIPF = 100_000, 16, 256, 1.05
GROUPS = 2


def _model(rows: int = ROWS) -> Any:
    import torch
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec import EmbeddingBagCollection
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.optim import RowWiseAdagrad

    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name="t0", embedding_dim=DIM, num_embeddings=rows, feature_names=["f0"]
            )
        ],
        device=torch.device("cpu"),
    )
    _apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), {"lr": 0.01})

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ebc, self.top = ebc, torch.nn.Linear(DIM, 1)

        def forward(self, kjt: Any) -> Any:
            return self.top(self.ebc(kjt)["f0"]).squeeze(1)

    return Model()


def _batch(step: int, group: int, rows: int = ROWS) -> Any:
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    gen = torch.Generator().manual_seed(step * 1009 + group)
    weights = torch.arange(1, rows + 1, dtype=torch.float64).pow(-ZIPF)
    ids = torch.multinomial(weights, LOOKUPS, replacement=True, generator=gen)
    return KeyedJaggedTensor.from_lengths_sync(
        keys=["f0"], values=ids, lengths=torch.ones(LOOKUPS, dtype=torch.int64)
    )


def _group(
    group: int,
    lighthouse: str,
    engine: str,
    steps: int,
    queue: Any,
    variant: str = "",
    rows: int = ROWS,
) -> None:
    import datetime
    import logging
    import warnings

    import torch
    import torch.distributed as dist

    # torchft's manager joins the group's store at MASTER_PORT: bound here on a port the
    # kernel picks (nothing can take it between a choice and the bind)
    timeout = datetime.timedelta(seconds=300)
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timeout)
    rendezvous_env(0, 1, "")
    os.environ["MASTER_PORT"] = str(store.port)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=timeout)
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from sparse2d import DMPCollection
    from sparse2d.ft import FaultTolerance, FTOptions
    from sparse2d.sync.options import SyncOptions

    model = DMPCollection(_model(rows), 1, device="cpu", sync_options=SyncOptions(engine=engine))
    dense = [p for _, p in in_backward_optimizer_filter(model.named_parameters())]
    options = FTOptions(
        replica_id=group,
        num_groups=GROUPS,
        min_replica_size=GROUPS,
        lighthouse=lighthouse,
        timeout_s=60,
        quorum_timeout_s=120,
    )
    ft = FaultTolerance(model, torch.optim.SGD(dense, lr=0.01), options)
    if variant == "fresh":  # the copies in buffers of their own, flattened at the send
        from sparse2d.sync.engines.base import BufferPool

        ft.policy.engine.pool = BufferPool()
    handed: list[int] = []
    counting = [False]
    channel = ft.channel
    one, queue_average = channel._start, channel.start

    def counted(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if counting[0]:
            handed[-1] += tensor.numel() * tensor.element_size()
        return one(tensor, *args, **kwargs)

    def counted_queue(buffers: list[torch.Tensor], hook: Any = None, async_op: bool = True) -> Any:
        if counting[0] and async_op:  # queued: sent with the step's gradients, after the sync
            handed[-1] += sum(b.numel() * b.element_size() for b in buffers)
        return queue_average(buffers, hook, async_op)

    channel._start = counted  # every all-reduce the sync starts on torchft's group
    channel.start = counted_queue  # and every average it queues for the step's all-reduce
    synced, cpu, wall = [], [], []
    begin = time.perf_counter()
    while ft.step < steps:
        ft.start_step()
        ((model(_batch(ft.position, group, rows)) - 1.0) ** 2).mean().backward()
        handed.append(0)
        counting[0] = True
        cpu.append(-time.thread_time())
        wall.append(-time.perf_counter())
        ft.sync_embeddings()
        counting[0] = False
        stats = getattr(ft.policy.engine, "stats", None)
        synced.append(stats.rows_synced if stats is not None else None)
        ft.finish_step()
        cpu[-1] += time.thread_time()
        wall[-1] += time.perf_counter()
    seconds = time.perf_counter() - begin
    summary = ft.summary()
    ft.shutdown()
    queue.put(
        (
            group,
            {
                "bytes": handed,
                "rows": synced,
                "seconds": seconds,
                "summary": summary,
                "step_cpu_s": cpu,
                "step_wall_s": wall,
                "placed": ft.channel.arena.placed,
            },
        )
    )
    queue.close()
    queue.join_thread()  # flush the result before the hard exit below
    os._exit(0)  # skip teardown: the other group may still be finishing its last step


def _run(engine: str, steps: int, variant: str = "", rows: int = ROWS) -> dict[str, Any]:
    import torch.multiprocessing as mp

    from sparse2d.ft.lighthouse import start_lighthouse

    lighthouse = start_lighthouse(min_replicas=GROUPS)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(
            target=_group, args=(g, lighthouse.address(), engine, steps, queue, variant, rows)
        )
        for g in range(GROUPS)
    ]
    try:
        for p in procs:
            p.start()
        out = dict(queue.get(timeout=600) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
        lighthouse.shutdown()
    return out


def _markdown(result: dict[str, Any], args: argparse.Namespace) -> str:
    dense, sparse = result["dense"], result["sparse"]
    rows = []
    for name, run in (("dense", dense), ("sparse (touched rows)", sparse)):
        per_sync = run[0]["bytes"]
        mean = sum(per_sync) / len(per_sync)
        synced = [r for r in run[0]["rows"] if r is not None]
        rows_text = f"{sum(synced) / len(synced):,.0f}" if synced else f"{2 * ROWS:,} (all)"
        later = per_sync[1:]  # the first sync follows the start's heal: dense everywhere
        later_mb = sum(later) / len(later) / 1e6
        rows.append(f"| {name} | {mean / 1e6:.3f} | {later_mb:.3f} | {rows_text} |")
    ratio = result["ratio"]
    verdict = "met" if ratio <= 0.1 else "NOT met"
    return "\n".join(
        [
            "## Sync bytes under fault tolerance: touched rows vs dense",
            "",
            f"`bench/ft_sync_bytes.py --steps {args.steps}`: 2 torchft groups x 1 gloo rank, one "
            f"{ROWS:,} x {DIM} table with row-wise AdaGrad, Zipf({ZIPF}) ids, {LOOKUPS} lookups "
            f"per group and step, {args.steps} steps with a sync each. Bytes are those handed to "
            "torchft's all-reduces "
            "during the sync (agreement metadata and payload, counted by wrapping "
            "`ManagedChannel._start` and its queued averages), mean per sync on group 0; "
            "rows = weight and accumulator rows "
            "per sync (counted once per kind). The first sync follows the start's heal (torchft's "
            "init_sync), after which the touched-row engine syncs densely once by design; the "
            "ratio below counts it.",
            "",
            "| engine | MB per sync | MB per sync after the first | rows per sync |",
            "|---|---|---|---|",
            *rows,
            "",
            f"Touched rows send **{ratio:.4f}x** the dense engine's bytes (acceptance <= 1/10: "
            f"{verdict}). {args.machine}; the box was shared with other jobs (bytes do not "
            "depend on load).",
        ]
    )


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _step_ms(out: dict[int, Any], key: str) -> float:
    """The groups' mean of their median step ``key`` (seconds) after the third step (the
    start's heal and the send buffer's sizing), in ms."""
    return 1e3 * sum(_median(g[key][3:]) for g in out.values()) / GROUPS


def _send_buffer(args: argparse.Namespace) -> dict[str, Any]:
    """Rounds of (arena, fresh), the order reversed every other round; per run, the step's
    CPU and wall ms (``_step_ms``)."""
    runs: dict[str, list[dict[str, float]]] = {"arena": [], "fresh": []}
    for i in range(args.rounds):
        for variant in ("arena", "fresh") if i % 2 == 0 else ("fresh", "arena"):
            out = _run("dense", args.steps, variant, args.rows)
            runs[variant].append(
                {
                    "cpu_ms": _step_ms(out, "step_cpu_s"),
                    "wall_ms": _step_ms(out, "step_wall_s"),
                    "placed": min(g["placed"] for g in out.values()),
                }
            )
            print(variant, runs[variant][-1], flush=True)
    return runs


def _send_buffer_markdown(runs: dict[str, Any], args: argparse.Namespace) -> str:
    mean = {
        v: {k: sum(r[k] for r in rs) / len(rs) for k in ("cpu_ms", "wall_ms")}
        for v, rs in runs.items()
    }
    payload_mb = (args.rows * DIM + args.rows) * 4 / 1e6
    lines = [
        "## The sync's copies gathered into the step's send buffer (fault tolerance)",
        "",
        f"`bench/ft_sync_bytes.py --send-buffer --rows {args.rows} --steps {args.steps} "
        f"--rounds {args.rounds}`: 2 torchft groups x 1 gloo rank, one {args.rows:,} x {DIM} "
        f"table with row-wise AdaGrad (a {payload_mb:.1f} MB dense payload per sync), a sync "
        "every step. Per step, main-thread CPU and wall ms of `sync_embeddings` + "
        "`finish_step` (gather, the step's all-reduce, vote, write-back), median over the "
        "steps after the third, mean of the groups. `arena`: the copies are gathered into the "
        "step's send buffer and averaged there (`sparse2d.ft.transport`); `fresh`: "
        "into buffers of their own, flattened with the gradients into a fresh send buffer "
        "and copied back out after the all-reduce (the code before). Rounds alternate, the "
        "order reversed every other round.",
        "",
        "| round | arena CPU ms | fresh CPU ms | arena wall ms | fresh wall ms |",
        "|---|---|---|---|---|",
    ]
    for i, (a, f) in enumerate(zip(runs["arena"], runs["fresh"], strict=True)):
        lines.append(
            f"| {i} | {a['cpu_ms']:.2f} | {f['cpu_ms']:.2f} | {a['wall_ms']:.2f} | "
            f"{f['wall_ms']:.2f} |"
        )
    placed = min(r["placed"] for r in runs["arena"])
    lines += [
        "",
        f"Mean: CPU {mean['arena']['cpu_ms']:.2f} vs {mean['fresh']['cpu_ms']:.2f} ms "
        f"(**{mean['arena']['cpu_ms'] / mean['fresh']['cpu_ms']:.3f}x**), wall "
        f"{mean['arena']['wall_ms']:.2f} vs {mean['fresh']['wall_ms']:.2f} ms "
        f"(**{mean['arena']['wall_ms'] / mean['fresh']['wall_ms']:.3f}x**). The send buffer "
        f"held the copies in at least {placed} of {args.steps} steps per run (not the first: "
        "it is sized there). It also removes one payload-sized allocation from each step's "
        f"peak (the fresh send buffer, {payload_mb:.1f} MB here). {args.machine}.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-results-md", action="store_true", help="do not edit RESULTS.md")
    parser.add_argument("--render", action="store_true", help="re-render from the JSON")
    parser.add_argument(
        "--send-buffer",
        action="store_true",
        help="time the step with the copies in the send buffer or not",
    )
    parser.add_argument("--rows", type=int, default=ROWS, help="table rows (--send-buffer)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds (--send-buffer)")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    if args.send_buffer:
        runs = _send_buffer(args)
        args.machine = (
            f"{os.cpu_count()} cores, load {load:.1f} at start, {os.getloadavg()[0]:.1f} at end"
        )
        publish(
            args,
            runs | {"machine": args.machine},
            _send_buffer_markdown(runs, args),
            "ft_send_buffer.json",
            "ft_send_buffer",
        )
        return
    if args.render:
        import json

        result = json.loads((args.out / "ft_sync_bytes.json").read_text())
        result = {
            k: v if k in ("ratio", "machine") else {int(g): r for g, r in v.items()}
            for k, v in result.items()
        }
        args.machine = result.pop("machine")
        publish(
            args,
            result | {"machine": args.machine},
            _markdown(result, args),
            "ft_sync_bytes.json",
            "ft_sync_bytes",
        )
        return
    result: dict[str, Any] = {name: _run(name, args.steps) for name in ("dense", "sparse")}
    mean = {n: sum(r[0]["bytes"]) / len(r[0]["bytes"]) for n, r in result.items()}
    result["ratio"] = mean["sparse"] / mean["dense"]
    args.machine = (
        f"{os.cpu_count()} cores, load {load:.1f} at start, {os.getloadavg()[0]:.1f} at end"
    )
    text = _markdown(result, args)
    publish(args, result | {"machine": args.machine}, text, "ft_sync_bytes.json", "ft_sync_bytes")


if __name__ == "__main__":
    main()
