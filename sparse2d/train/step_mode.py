"""What the trainer's one loop (``sparse2d.train.loop``) asks of its mode.

The loop owns everything both modes share: model and optimizer start-up, the run recorder,
train windows and their logs, evaluation, checkpoint cadence and the summary. A mode owns
how a step is attempted and what it counts:

- ``InWorld`` (``sparse2d.train.in_world``): one torchrun world holds every replica; a
  step always completes; the replica sync's reports (seconds, bytes, modes) are counted.
- ``FaultTolerantMode`` (``sparse2d.train.ft_mode``): this world is one replica group of a
  torchft job; a step is an attempt that commits or fails (quorum, heal, vote through
  ``sparse2d.ft``), and the mode counts commits, failed commits, heals and skipped samples.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from sparse2d.train.data import DataSource

if TYPE_CHECKING:
    from sparse2d.train.config import Config
    from sparse2d.train.loop import Loop


def evaluates_after(cfg: Config, done: int) -> bool:
    """The loop evaluates after ``done`` steps (``train.eval_every``; the final evaluation
    follows the loop). A mode whose commits land late lands these at once."""
    every = cfg.train.eval_every
    return bool(every) and done % every == 0 and done != cfg.train.steps


def saves_after(cfg: Config, done: int) -> bool:
    """The loop saves a checkpoint after ``done`` steps: on ``checkpoint.every`` and at the
    end. A mode whose commits land late lands these at once."""
    every = cfg.checkpoint.every
    return every > 0 and (done % every == 0 or done == cfg.train.steps)


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

    def data(self, loop: Loop) -> tuple[DataSource, DataSource]:
        """(train data, eval data) of this rank."""

    def attach(self, loop: Loop) -> None:
        """Called once the model and optimizer exist: resume, build the step driver."""

    @property
    def completed(self) -> int:
        """Steps of the job done so far (committed, under fault tolerance)."""

    def shape(self, loop: Loop) -> dict[str, int]:
        """``world_size``, ``sharding_group_size``, ``num_replicas`` of the job."""

    def header(self, loop: Loop) -> dict[str, Any]:
        """The mode's fields of the ``start`` record."""

    def attempt(self, loop: Loop) -> Attempt | None:
        """Run one step; None: this process has nothing left to do (stop cleanly)."""

    def paused(self) -> contextlib.AbstractContextManager[None]:
        """Around evaluation (a pipeline hands the model's forward back)."""

    def window(self, loop: Loop, steps: int, last: Attempt) -> dict[str, Any]:
        """The mode's fields of a ``train`` record over ``steps`` logged steps (collective)."""

    def checkpoint_extra(self, step: int, loop: Loop) -> dict[str, Any]:
        """What a checkpoint at ``step`` carries besides the model (resume needs it)."""

    def summary(self, loop: Loop) -> dict[str, Any]:
        """The mode's fields of ``summary.json`` (collective)."""

    def final_text(self, summary: dict[str, Any]) -> str:
        """The mode's fields of the printed ``final`` line."""

    def close(self) -> None:
        """Release what the mode started (the torchft manager)."""
