"""What the trainer's one loop (``sparse2d.train.loop``) asks of its mode.

The loop owns what both modes share (start-up, recorder, logs, evaluation, checkpoints,
summary); a mode owns how a step is attempted and what it counts: ``InWorld`` (one torchrun
world holds every replica) or ``FaultTolerantMode`` (this world is one replica group of a
torchft job; a step commits or fails). A mode never sees the loop: it gets the rank and world
size for its data, then a ``Run`` for everything after.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from sparse2d.checkpoint.directory import partial_saves
from sparse2d.train.data import DataSource
from sparse2d.train.recorder import Recorder


def name_partial_saves(where: str) -> None:
    """Print each save under ``where`` that never completed (every host lost mid-save): a
    resume never reads one, and says so (either mode, on its main rank)."""
    for name in partial_saves(where):
        print(f"[resume] not read: {name}, a save that never completed", flush=True)


@dataclass
class Run:
    """What a mode works on once the model exists (the loop builds it; a mode never holds
    the loop)."""

    model: Any
    """The sharded model (``sparse2d.DMPCollection``)."""
    optimizer: torch.optim.Optimizer
    """The dense optimizer (the sparse one is fused into the model's backward)."""
    data: DataSource
    """This rank's training data."""
    device: torch.device
    world: int
    """Ranks in this torchrun world."""
    is_main: bool
    """Rank 0 of this world (it prints)."""
    recorder: Recorder
    """The run directory's records (``log`` at the mode's ``completed`` step, ``say``)."""


@dataclass
class Attempt:
    """One attempted step, as the loop sees it."""

    logits: torch.Tensor
    labels: torch.Tensor
    committed: bool
    """False: a failed commit under fault tolerance (no state moved; the batch is used up)."""
    samples: int
    """Samples the job trained in this step, over every replica taking part."""
    participants: int | None = None
    """Replica groups in the step's quorum (fault tolerance), else None."""
    startup_s: float = 0.0
    """Seconds of this attempt that were start-up, not training: a fault-tolerant group's
    first quorum (waiting for every planned group, the step-0 heal), as the standard
    launcher's rendezvous is outside its timed steps."""


class Mode(Protocol):
    """A trainer mode (see the module docstring)."""

    run_dir: str
    """Where the recorder writes (``RUN_DIR``, or ``RUN_DIR/replica_<g>`` for a group)."""
    checkpoint_dir: str
    label: str
    """Prefix of the printed lines (``replica=<g>``), or empty."""
    wall_time: bool
    """Whether records carry the wall ``time``."""

    def data(self, rank: int, world: int) -> tuple[DataSource, DataSource]:
        """(train data, eval data) of rank ``rank`` of this world (before the model exists)."""

    def attach(self, run: Run) -> None:
        """Called once the model and optimizer exist: resume, build the step driver."""

    @property
    def completed(self) -> int:
        """Steps of the job done so far (committed, under fault tolerance)."""

    def shape(self, run: Run) -> dict[str, int]:
        """``world_size``, ``sharding_group_size``, ``num_replicas`` of the job."""

    def header(self, run: Run) -> dict[str, Any]:
        """The mode's fields of the ``start`` record."""

    def attempt(self, run: Run) -> Attempt | None:
        """Run one step; None: this process has nothing left to do (stop cleanly)."""

    def paused(self) -> contextlib.AbstractContextManager[None]:
        """Around evaluation (a pipeline hands the model's forward back)."""

    def window(self, run: Run, steps: int, last: Attempt) -> dict[str, Any]:
        """The mode's fields of a ``train`` record over ``steps`` logged steps (collective)."""

    def checkpoint_extra(self, step: int, run: Run) -> dict[str, Any]:
        """What a checkpoint at ``step`` carries besides the model (resume needs it)."""

    def summary(self, run: Run) -> dict[str, Any]:
        """The mode's fields of ``summary.json`` (collective)."""

    def final_text(self, summary: dict[str, Any]) -> str:
        """The mode's fields of the printed ``final`` line."""

    def close(self) -> None:
        """Release what the mode started (the torchft manager)."""
