"""The environment of a reader's fresh shell, for tests that run a documented command as
written: none of the harness's variables (``OMP_NUM_THREADS=1`` hid a fork-after-OpenMP hang
in ``sparse2d dryrun``), no rank variables, and this checkout first on the import path (the
installed venv may be another checkout's editable install)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HARNESS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PYTHON",
    "NPROC",
    "CONFIG",
    "MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "CUDA_VISIBLE_DEVICES",
)


def reader_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in HARNESS and not k.startswith("PYTEST")}
    env["PYTHONPATH"] = str(ROOT)
    return {**env, **extra}


def console_script(name: str) -> str:
    """``.venv/bin/<name>``: the entry point installed next to the interpreter running tests."""
    return str(Path(sys.executable).parent / name)


def terminal_signals() -> None:
    """``preexec_fn`` for a command a test interrupts as a terminal would: SIGINT at its
    default. A test run started in the background (``nohup``, ``&`` in a script, some CI
    runners) inherits SIGINT ignored, and a shell cannot trap, nor Python catch, a signal
    ignored when it started: the Ctrl-C under test would never arrive."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
