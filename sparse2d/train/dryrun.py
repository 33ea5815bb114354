"""``sparse2d dryrun``: one rank of an ``N``-rank training job, built on this machine.

Builds the trainer's real model and ``DMPCollection`` for rank ``r`` of ``N`` on torch's fake
process group (``sparse2d.fake_world``) and prints what the rank holds; its flags and report:
docs/training.md, "Start-up at scale". torch, TorchRec and the model are imported inside the
functions, so a bad config is refused before their seconds of import.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from sparse2d.errors import ConfigError
from sparse2d.known_warnings import ignore_known_warnings
from sparse2d.train.config import load_config


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
    parser.add_argument(
        "--max-storage",
        type=float,
        default=float(1 << 30),
        help="bytes of embedding shards the rank may allocate here (default 1 GiB); a rank "
        "that needs more is described from its plan alone, without a forward and backward",
    )
    parser.add_argument("--step-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="dotted.key=value config overrides")
    return parser


def _local_ddp_hooks(model: Any) -> None:
    """DDP's default gradient all-reduce hook fails under the fake backend (its future holds
    no tensor); a hook returning the bucket as is moves no data either, like the fake group."""
    import torch  # torch, TorchRec: inside (module docstring)
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
    from sparse2d.train.data import DataSource  # TorchRec: inside (module docstring)

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
    say), instead of running on as an orphan. On Linux the kernel kills it (``prctl``'s
    parent-death signal): garbage ids can corrupt the heap so that the main thread hangs in
    ``free()`` holding the GIL, and a watcher thread then never runs (an orphan found
    18 minutes after its test had timed out, 2026-11-29)."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)
        return

    def watch() -> None:  # elsewhere: a thread that watches the parent
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
    import torch.distributed as dist  # torch, TorchRec: inside (module docstring)

    from sparse2d.core.resources import GroupRecorder
    from sparse2d.fake_world import init_fake_world, rank_report
    from sparse2d.train.model_builder import build_model, resolve_device, shard

    cfg = load_config(args.config, args.overrides)
    local = args.local_world_size or min(args.world_size, 8)
    if args.world_size < 1:
        raise ConfigError(f"--world-size {args.world_size} must be >= 1.")
    cfg.check_runtime(args.world_size, local, new_run=False)  # writes no run records
    device = resolve_device(cfg)
    init_fake_world(args.rank, args.world_size, local)
    planned = None
    if cfg.parallel.sharding_group_size != "auto":  # (auto: shard's collective pick decides L)
        report, planned = _planned_only(cfg, device, args)
        if report is not None:
            dist.destroy_process_group()
            report["peak_rss_bytes"] = _peak_rss()
            return report
    recorder = GroupRecorder()
    with recorder.recording():
        model = shard(cfg, build_model(cfg, device), device, args.world_size)
    if args.step_child:
        return _step_here(cfg, model, device, args.rank, args.world_size)
    report = rank_report(model, recorder.groups)
    report["materialized"] = True
    if planned is not None:  # the plan was made (or loaded) by the planning pass
        _planning_pass(report["construction"], planned)
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


def _planning_pass(construction: dict[str, Any], planned: dict[str, Any]) -> None:
    """The build's construction record with the planning pass's plan phase: the build
    itself loaded the plan that pass had just stored."""
    total = construction["total_s"] - construction["plan_s"] + planned["plan_s"]
    construction.update(
        plan_s=planned["plan_s"], total_s=round(total, 4), plan_cache=planned["plan_cache"]
    )
    construction["plans"] = planned["plans"]


def _planned_only(
    cfg: Any, device: Any, args: argparse.Namespace
) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The rank from its plan alone when its shards need more than ``--max-storage`` bytes
    (a 1,024-GPU job's rank holds tens of GB): nothing is sharded, no storage allocated.
    None when the rank fits: it is built for real (the plan is stored, so that is a hit);
    with the planning pass's construction record either way."""
    import torch  # torch, TorchRec: inside (module docstring)

    from sparse2d.core.resources import GroupRecorder
    from sparse2d.fake_world import layout_report, plan_rank, planned_shards
    from sparse2d.train.model_builder import build_model, shard_options

    recorder = GroupRecorder()
    size = cfg.group_size(args.world_size)
    with recorder.recording():
        meta = build_model(cfg, torch.device("meta"))  # the plan reads shapes only
        plan, contexts, construction = plan_rank(meta, size, **shard_options(cfg, device))
    shapes = {t.name: (t.rows, t.dim) for t in cfg.model.specs()}
    shards = planned_shards(plan, args.rank, shapes)
    need = sum(s["weight_bytes"] for s in shards)
    if need <= args.max_storage:
        return None, construction.record()
    why = (
        f"not run: the rank's shards need {need / 1e9:.2f} GB of real storage, over "
        f"--max-storage {args.max_storage:.0f} bytes; a dry run allocates none"
    )
    report = layout_report(contexts, construction, recorder.groups)
    report.update(
        materialized=False,
        embedding_bytes=need,
        optimizer_state_bytes=None,
        shards=shards,
        config=args.config,
        run_dir=cfg.run_dir,
        total_embedding_bytes=sum(4 * t.rows * t.dim for t in cfg.model.specs()),
        forward_backward={"ran": False, "forward": False, "skipped": why},
    )
    return report, report["construction"]


def _peak_rss() -> dict[str, int]:
    """Peak resident memory of this process and of the step's process (Linux: KiB)."""
    import resource  # POSIX only: imported where it is used, not at the dry run's start

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
