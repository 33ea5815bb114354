"""The ``train`` (loop length, evaluation, logging, pipeline) and ``metrics`` sections."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sparse2d.train.config.io import positive


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    """Loop length, evaluation and logging."""

    steps: int = 1000
    """Optimizer steps."""
    eval_every: int = 0
    """Evaluate every N steps (0: only at the end; the final evaluation always runs)."""
    eval_batches: int = 20
    """Evaluation batches per rank (a fixed held-out set of ``eval_batches`` global batches)."""
    log_every: int = 50
    """Log train loss/AUC/NE, samples/s and sync time every N steps."""
    resume: Literal["none", "auto"] = "none"
    """``auto``: continue from the latest checkpoint in ``checkpoint.dir`` when there is one."""
    progress_bar: bool = True
    """Show a tqdm progress bar (rank 0 only, and only when stderr is a terminal: logs get lines)."""
    pipeline: Literal["sparse_dist", "semi_sync", "none"] = "none"
    """TorchRec train pipeline driving the steps: ``sparse_dist`` (``TrainPipelineSparseDist``:
    the next batches' input all-to-all overlaps this step), ``semi_sync``
    (``TrainPipelineSemiSync``: the next batch's embedding lookup too, on weights one step
    older), ``none`` (plain forward, backward, step; measured fastest on CPU, bench/RESULTS.md).
    Replicas sync on the ``parallel.sync`` cadence either way."""

    def __post_init__(self) -> None:
        positive(self, "steps", "eval_batches", "log_every")
        positive(self, "eval_every", allow_zero=True)


@dataclass(kw_only=True, slots=True)
class MetricsConfig:
    """What a run records besides ``metrics.jsonl`` and ``summary.json`` (rank 0 only)."""

    tensorboard: bool = True
    """Write TensorBoard event files to ``RUN_DIR/tensorboard/``: every logged number (train
    and eval loss, AUC, NE, samples/s, sync seconds, bytes and modes, replica divergence, ...)
    as a scalar at its step. Needs the ``tensorboard`` package (``pip install
    'sparse2d[train]'``; ``make train`` installs it). View: ``tensorboard --logdir runs``."""
