"""The trainer's entry point: ``python -m sparse2d.train --config configs/NAME.yaml [dotted.key=value ...]``.

Launched by ``torchrun`` (see ``launch/``): builds the model, shards it with ``DMPCollection``,
trains, syncs, evaluates and writes ``RUN_DIR/metrics.jsonl`` and ``summary.json``. Any rank's
failure prints one line (``sparse2d.train: rank R: ...``) and exits 1.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import logging
import os
import socket
import sys
import time
import traceback

import torch
import torch.distributed as dist

from sparse2d.errors import CheckpointError, ConfigError, FaultToleranceError, SyncError
from sparse2d.known_warnings import ignore_known_warnings
from sparse2d.train.config import load_config
from sparse2d.train.failure import describe, is_peer_failure
from sparse2d.train.model_builder import resolve_device
from sparse2d.train.rendezvous import owns_round_store, round_store, shared_store_across_hosts
from sparse2d.train.torchrun import final_failure


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def _single_process_env() -> None:
    """Let ``python -m sparse2d.train`` run without torchrun (world of one)."""
    if "RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )


def _say(rank: int, text: str) -> None:
    """One ``sparse2d.train: rank R: ...`` line in a single write: ranks share the launcher's
    stderr pipe, and ``print`` writes the text and its newline apart, so two ranks' lines
    could land glued on one line (seen in CI)."""
    line = f"sparse2d.train: rank {rank}: " + text.replace("\n", " ") + "\n"
    sys.stderr.flush()
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # captured (pytest's capsys): no descriptor
        sys.stderr.write(line)
        return
    os.write(fd, line.encode("utf-8", "replace"))


def _report(rank: int, error: BaseException, with_traceback: bool) -> None:
    if with_traceback:
        traceback.print_exc()
    _say(rank, f"{type(error).__name__}: {error}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sparse2d.train", description=__doc__)
    parser.add_argument("--config", required=True, help="YAML file (configs/*.yaml)")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value overrides")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="torch.profiler trace of a few steps on rank 0 into RUN_DIR/profile/",
    )
    return parser


def _warn_shared_agent_store(rank: int) -> None:
    """torchrun restarts across hosts with its agent store shared never reconnect: say so
    once, up front, instead of letting the restarted workers fail in gloo's connect. (One
    host is safe: sparse2d.train.rendezvous gives each round a store of its own.)"""
    if rank == 0 and _env_int("TORCHELASTIC_MAX_RESTARTS", 0) > 0 and shared_store_across_hosts():
        print(
            "sparse2d.train: warning: torchrun restarts are on but its agent store is shared "
            "across restart rounds and hosts; restarted workers will fail to connect (gloo "
            "connectFullMesh). Export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 or use launch/*.sh.",
            file=sys.stderr,
            flush=True,
        )


REPORTER_WAIT_S = 30.0
"""How long a rank that stays silent on a bad config or checkpoint waits before exiting."""


def _await_reporter() -> None:
    """Stay alive while local rank 0 writes the error line. A silent rank that exited first
    makes torchrun stop the host's other workers, local rank 0 among them, and under load
    that landed before its line was written (seen in a suite run). The check is deterministic, so
    rank 0 fails too and torchrun ends this rank once it exits; the wait is only a bound."""
    time.sleep(REPORTER_WAIT_S)


def _bad_input(rank: int, error: ConfigError | CheckpointError, reports: bool) -> None:
    """One line from the reporting ranks (the check is the same on every rank: once per
    host; fault-tolerant: every rank), the others wait for it. A ConfigError is final: a
    restart would fail the same way, so the launchers' agent ends the job instead
    (sparse2d/train/torchrun.py). A CheckpointError may pass (a disk freed, a share back)."""
    if not reports:
        _await_reporter()
        return
    _report(rank, error, with_traceback=False)
    if isinstance(error, ConfigError):
        final_failure(f"{type(error).__name__}: {error}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    ignore_known_warnings()  # by message: a new warning still shows
    faulthandler.enable()  # a native abort (SIGABRT/SIGSEGV) prints every thread's stack
    _single_process_env()
    rank, local_rank = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    _warn_shared_agent_store(rank)
    world, local_world = _env_int("WORLD_SIZE", 1), _env_int("LOCAL_WORLD_SIZE", 1)
    code = 1
    loop = None
    cfg = None
    try:
        # Deterministic checks on every rank, before any collective: all ranks agree.
        cfg = load_config(args.config, args.overrides)
        cfg.check_runtime(world, local_world)
        note = cfg.one_replica_note(world)
        if note and rank == 0:
            _say(rank, f"note: {note}")
        if cfg.fault_tolerance.enable:  # another job's lighthouse: now
            from sparse2d.train.ft_mode import check_lighthouse

            check_lighthouse(cfg)
        device = resolve_device(cfg)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        torch.set_num_threads(max(1, _env_int("OMP_NUM_THREADS", torch.get_num_threads())))
        for name in ("torchrec", "torch.fx", "fbgemm_gpu"):  # planner/tracing chatter
            logging.getLogger(name).setLevel(logging.ERROR)
        timeout = datetime.timedelta(seconds=cfg.parallel.timeout_s)
        backend = "nccl" if device.type == "cuda" else "gloo"
        if owns_round_store():  # one torchrun agent: a store per restart round, no port race
            store = round_store(rank, timeout)
            dist.init_process_group(
                backend, store=store, rank=rank, world_size=world, timeout=timeout
            )
        else:
            dist.init_process_group(backend, timeout=timeout)
        # here, not at the top: the loop loads TorchRec (and its modes), which a bad config,
        # checked above on every rank, must not wait for
        from sparse2d.train.loop import Loop

        loop = Loop(cfg, device, profile=args.profile)
        loop.run()
        code = 0
    except (ConfigError, CheckpointError) as error:  # bad input or checkpoint: no traceback
        ft = cfg is not None and cfg.fault_tolerance.enable  # a group's ranks may differ
        _bad_input(rank, error, reports=local_rank == 0 or ft)
    except FaultToleranceError as error:  # every rank of the group says why it stops
        _report(rank, error, with_traceback=False)
        if error.after_report is not None:  # the group's other lines, before torchrun stops it
            error.after_report()
    except SyncError as error:  # raised on every rank with the same text: once per job
        if rank == 0 or (cfg is not None and cfg.fault_tolerance.enable):  # ft: the bad rank
            _report(rank, error, with_traceback=False)
    except Exception as error:
        if dist.is_initialized() and is_peer_failure(error):  # one line per survivor
            line = describe(error, getattr(loop, "step", None), getattr(loop, "peers", None))
            _say(rank, line)
        else:
            _report(rank, error, with_traceback=True)
    finally:
        if dist.is_initialized():
            if code == 0:
                dist.barrier()  # every rank finished its collectives and file writes
            # Skip native teardown: on failure, do not wait in destroy for ranks still
            # working; on success nothing is left to do, and process-group/thread-pool
            # destructors at exit were seen (rarely, under load) to abort with
            # "terminate called without an active exception" after a clean run.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
