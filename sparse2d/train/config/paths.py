"""Directories the trainer will write, checked before any process group forms.

A ``run_dir`` or ``checkpoint.dir`` the job cannot write used to surface at the first
metrics line or the first save, minutes in, on every rank, and then torchrun restarted the
group into the same error. ``check_writable`` probes each one (a temporary directory made
and removed in its nearest existing ancestor) from the launchers' config check and from
``check_runtime`` on every rank at start, and names the key and the fix in one line.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from sparse2d.errors import ConfigError


def unwritable(path: str) -> str | None:
    """Why ``path`` cannot be (made) a directory this process writes into; None if it can."""
    existing = os.path.abspath(path)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"{existing!r} is a file, not a directory"
    try:
        probe = tempfile.mkdtemp(prefix=".sparse2d-write-check-", dir=existing)
    except OSError as error:
        return f"cannot create a directory in {existing!r} ({error.strerror or error})"
    os.rmdir(probe)
    return None


def check_writable(cfg: Any) -> None:
    """``run_dir`` (metrics, plans, records) and, when checkpoints are saved, ``checkpoint.dir``."""
    problem = unwritable(cfg.run_dir)
    if problem:
        raise ConfigError(
            f"run_dir={cfg.run_dir!r}: {problem}: set run_dir to a directory this user can write."
        )
    if cfg.checkpoint.every > 0 and cfg.checkpoint.dir is not None:
        problem = unwritable(cfg.checkpoint.dir)
        if problem:
            raise ConfigError(
                f"checkpoint.dir={cfg.checkpoint.dir!r}: {problem}: set checkpoint.dir to a "
                "directory this user can write (or checkpoint.every=0 to save none)."
            )


def launch_job() -> str | None:
    """The launch this process belongs to, the same on every host and relaunch of one job:
    the fault-tolerant job's name (``$SPARSE2D_FT_JOB``, set by the launchers), else
    torchrun's rendezvous id (``--rdzv-id``; random per ``--standalone`` launch)."""
    job = os.environ.get("SPARSE2D_FT_JOB") or os.environ.get("TORCHELASTIC_RUN_ID")
    return job if job and job != "none" else None


def recorded_job(metrics: str) -> str | None:
    """The ``job`` of the first ``start`` record in ``metrics`` (None: none recorded)."""
    try:
        with open(metrics) as f:
            for line in f:
                if '"kind": "start"' in line:
                    return json.loads(line).get("job")
    except (OSError, ValueError):
        return None
    return None


def check_new_run(cfg: Any) -> None:
    """A run directory that already holds a run's records (``metrics.jsonl``) is written
    again only to continue that run: a torchrun restart of it, the same job launched again
    (``launch_job``: a scheduler restarting a lost host), or ``train.resume=auto`` from
    checkpoints it kept. Anything else would append a second run's records to the first's
    (and add a TensorBoard file beside its own) without a word. A fault-tolerant group owns
    ``RUN_DIR/replica_<g>`` alone, and is checked there."""
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0:
        return  # torchrun restarted this run's workers: the same run goes on
    run_dir, checkpoints = cfg.run_dir, cfg.checkpoint_dir
    if cfg.fault_tolerance.enable:
        group = f"replica_{cfg.fault_tolerance.replica_id}"
        run_dir = os.path.join(cfg.run_dir, group)
        checkpoints = os.path.join(cfg.checkpoint.dir or cfg.run_dir, group, "checkpoints")
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(metrics):
        return
    job = launch_job()
    if job is not None and job == recorded_job(metrics):
        return  # the same job launched again here: a scheduler restarting a lost host
    kept = os.path.isdir(checkpoints) and any(os.scandir(checkpoints))
    if cfg.train.resume == "auto" and kept:
        return
    why = (
        f"train.resume=auto finds no checkpoint in {checkpoints!r} to continue it from"
        if cfg.train.resume == "auto"
        else "a second run would append to its records"
    )
    raise ConfigError(
        f"run_dir={cfg.run_dir!r} already holds a run ({metrics}) and {why}: set run_dir to a "
        "new directory or delete this one"
        + ("" if cfg.train.resume == "auto" or not kept else ", or continue it: train.resume=auto")
        + "."
    )
