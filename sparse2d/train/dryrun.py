"""``sparse2d dryrun``: one rank of an ``N``-rank training job, built on this machine.

``sparse2d dryrun --config C --world-size N [--rank r] [--local-world-size K] [--out FILE]
[--no-step] [dotted.key=value ...]`` builds the trainer's real model and ``DMPCollection``
for rank ``r`` of ``N`` on torch's fake process group (``sparse2d.dryrun``) and prints one
JSON object (also written to ``--out``, default ``RUN_DIR/dryrun/rank<r>_of_<N>.json``):
the rank's embedding and optimizer-state bytes, its shards, sharding and replica groups,
the process groups built, seconds per construction phase, the plan's source, and whether
one forward and backward ran through the fake collectives (their outputs carry no data:
this checks shapes and code paths, not numbers). The plan goes through the same plan
store as a launch of that config (``RUN_DIR/plans``), so a dry run before a launch saves
the launch its planning. A bad config, group size or plan exits 1 with the one-line error
a launch would print.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from typing import Any

from sparse2d.errors import ConfigError
from sparse2d.known_warnings import ignore_known_warnings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sparse2d dryrun", description=__doc__)
    parser.add_argument("--config", required=True, help="trainer YAML config")
    parser.add_argument("--world-size", type=int, required=True, help="ranks in the job (N)")
    parser.add_argument("--rank", type=int, default=0, help="the rank to build (default 0)")
    parser.add_argument("--local-world-size", type=int, help="ranks per host (default min(N, 8))")
    parser.add_argument("--out", help="JSON file (default RUN_DIR/dryrun/rank<r>_of_<N>.json)")
    parser.add_argument(
        "--no-step",
        action="store_true",
        help="skip the forward and backward through the fake collectives",
    )
    parser.add_argument(
        "--step-timeout",
        type=float,
        default=300.0,
        help="seconds the forward and backward may take before it is killed (default 300)",
    )
    parser.add_argument("--step-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="dotted.key=value config overrides")
    return parser


def _local_ddp_hooks(model: Any) -> None:
    """DDP's default gradient all-reduce hook fails under the fake backend (its future holds
    no tensor); a hook returning the bucket as is moves no data either, like the fake group."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    def keep(_, bucket):  # type: ignore[no-untyped-def]  # DDP checks unannotated or real types
        future = torch.futures.Future()
        future.set_result(bucket.buffer())
        return future

    for module in model.modules():
        if isinstance(module, DistributedDataParallel):
            module.register_comm_hook(None, keep)


def _step_here(cfg: Any, model: Any, device: Any, rank: int, world: int) -> dict[str, Any]:
    """``--step-child``: one forward and backward of a real batch through the fake collectives
    in this (fresh) interpreter; their outputs are uninitialized memory (the fake backend moves
    no data), so an error is reported, not raised."""
    from sparse2d.train.data import DataSource

    batch = DataSource(cfg, rank, world).train(0)[0].to(device)
    said = "forward: "
    try:
        _local_ddp_hooks(model)
        loss, _ = model(batch)
        said = "backward: "
        loss.backward()
        return {"ran": True, "forward": True}
    except Exception as error:  # noqa: BLE001 (reported to the parent)
        said += f"{type(error).__name__}: {error}"[:500]
    return {"ran": False, "forward": said.startswith("backward: "), "error": said}


def _exit_with_parent() -> None:
    """The step's child ends when the dry run that started it is gone (killed with SIGKILL,
    say), instead of running on as an orphan."""
    import time

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _try_step(argv: list[str], timeout_s: float) -> dict[str, Any]:
    """One forward and backward in a fresh interpreter (``--step-child``: the same rank,
    rebuilt from the plan just stored), never a fork of this one: a forked child of a process
    whose OpenMP pool exists waits forever in that pool's barrier. Its ids or lengths come
    from uninitialized memory and can crash FBGEMM's kernels, which must not take the report
    down; it is waited for at most ``timeout_s`` and killed with the dry run (Ctrl-C,
    SIGTERM: ``subprocess.run`` kills it on any exception)."""
    import subprocess

    command = [sys.executable, "-m", "sparse2d.train.dryrun", *argv, "--step-child"]
    try:
        child = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        said = f"no answer in {timeout_s:g} s (--step-timeout): the step's process was killed"
        return {"ran": False, "forward": False, "error": said}
    lines = child.stdout.strip().splitlines()
    if child.returncode == 0 and lines:
        return json.loads(lines[-1])
    tail = (child.stderr.strip().splitlines() or [""])[-1][:300]
    said = f"the step's process died (exit {child.returncode}): fake collectives carry no data"
    return {"ran": False, "forward": False, "error": f"{said}; {tail}" if tail else said}


def run(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    """Build the rank and describe it (raises the launch's errors)."""
    import torch.distributed as dist

    from sparse2d.dryrun import init_fake_world, rank_report
    from sparse2d.resources import GroupRecorder
    from sparse2d.train.config import load_config
    from sparse2d.train.model import build_model, resolve_device, shard

    cfg = load_config(args.config, args.overrides)
    local = args.local_world_size or min(args.world_size, 8)
    if args.world_size < 1:
        raise ConfigError(f"--world-size {args.world_size} must be >= 1.")
    cfg.check_runtime(args.world_size, local)
    device = resolve_device(cfg)
    init_fake_world(args.rank, args.world_size, local)
    recorder = GroupRecorder()
    with recorder.recording():
        model = shard(cfg, build_model(cfg, device), device, args.world_size)
    if args.step_child:
        return _step_here(cfg, model, device, args.rank, args.world_size)
    report = rank_report(model, recorder.groups)
    report["config"] = args.config
    report["run_dir"] = cfg.run_dir
    report["total_embedding_bytes"] = sum(4 * t.rows * t.dim for t in cfg.model.specs())
    dist.destroy_process_group()
    del model
    if not args.no_step:
        argv = sys.argv[1:] if argv is None else argv
        report["forward_backward"] = _try_step(argv, args.step_timeout)
    report["peak_rss_bytes"] = _peak_rss()
    return report


def _peak_rss() -> dict[str, int]:
    """Peak resident memory of this process and of the step's process (Linux: KiB)."""
    import resource

    kib = 1024 if sys.platform.startswith("linux") else 1
    return {
        "build": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * kib,
        "step": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * kib,
    }


def _terminate_as_exit(signum: int, _frame: Any) -> None:
    """SIGTERM unwinds like Ctrl-C, so the step's process is killed on the way out."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.step_child:
        _exit_with_parent()
    main_thread = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGTERM, _terminate_as_exit) if main_thread else None
    try:
        return _main(args, argv)
    except KeyboardInterrupt:  # the step's process was killed on the way here
        print(f"sparse2d dryrun: rank {args.rank}: interrupted", file=sys.stderr)
        return 130
    finally:
        if before is not None:
            signal.signal(signal.SIGTERM, before)


def _main(args: argparse.Namespace, argv: list[str] | None) -> int:
    ignore_known_warnings()  # by message: a new warning still shows
    for name in ("torchrec", "torch.fx", "fbgemm_gpu"):  # planner/tracing chatter, as a launch
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        report = run(args, argv)
    except ConfigError as error:  # PlanError, StoredPlanError too: the launch's one line
        line = f"{type(error).__name__}: {error}".replace("\n", " ")
        print(f"sparse2d dryrun: rank {args.rank}: {line}", file=sys.stderr)
        return 1
    if args.step_child:  # one line for the dry run that started this process
        print(json.dumps(report))
        return 0
    out = args.out or os.path.join(
        report["run_dir"], "dryrun", f"rank{args.rank}_of_{args.world_size}.json"
    )
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
