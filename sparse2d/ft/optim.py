"""Fault-tolerant step boundaries as an optimizer wrapper (torchft's ``OptimizerWrapper``
pattern), so any loop that calls ``zero_grad()`` before the forward and ``step()`` after the
backward runs fault-tolerant 2D unchanged, TorchRec's train pipelines included.

- ``zero_grad()`` joins the step's quorum; a group behind the quorum heals here, before its
  forward (``FaultTolerance.start_step``; a second call in one step does nothing). A group
  that cannot be behind only starts the quorum here; the model's forward joins it.
- between backward and ``step()``, ``model.sync()`` (TorchRec's ``sync_embeddings``) averages
  the embeddings over the quorum into copies; ``step()`` does it on the sync cadence when
  nobody did.
- ``step()`` averages the dense gradients, votes, writes the averages back and steps the
  dense optimizer only when the step commits (``FaultTolerance.finish_step``). With
  ``defer``, the vote lands (and the step commits) before the model's next forward instead
  (``sparse2d.ft.commit``): for loops that read the state only through ``ft`` in between.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from sparse2d.errors import ConfigError
from sparse2d.ft.fault_tolerant_steps import FaultTolerance


class FTOptimizer(torch.optim.Optimizer):
    """The dense optimizer of a ``FaultTolerance`` group, with its step boundaries."""

    def __init__(
        self,
        ft: FaultTolerance,
        expect_position: int | None = None,
        defer: Callable[[int], bool] | None = None,
    ) -> None:
        # no super().__init__: a thin wrapper over the group's dense optimizer
        self.ft = ft
        self.optim = ft.optimizer
        self.expect_position = expect_position
        """The data position of the batch the loop trains next, when the loop read it ahead
        (a pipeline prefetches): a heal that moves the group elsewhere is then refused, so
        no batch is trained twice or out of place. ``None``: the loop reads ``ft.position``."""
        self.defer = defer
        """``defer(step)``: whether the vote of the step that starts at committed step
        ``step`` may land at the model's next forward (the trainer: unless the loop
        evaluates or saves after it). Nothing may read the tables in between:
        ``TrainPipelineSparseDist`` looks up inside the forward; ``TrainPipelineSemiSync``
        looks the next batch up after ``step()`` in its warm-up batches (before
        ``start_batch``; the trainer's is 0), so those must not defer. None: every vote lands
        in ``step()``."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Join the step's quorum (heal if behind; or start it, joined before the model's
        forward), then clear the dense gradients."""
        self.ft.start_step(expect_position=self.expect_position)
        if not self.ft.pending:  # else the landing steps on the gradients, then clears them
            self.optim.zero_grad(set_to_none)

    def step(self, closure: object = None) -> None:  # type: ignore[override]
        """Vote and commit (``FaultTolerance.finish_step``); ``ft.last_committed`` says which
        (``ft.verdicts`` lists every landed one: with ``defer`` a step's lands later)."""
        if closure is not None:
            raise ConfigError("FTOptimizer.step takes no closure (the step is voted on first)")
        try:
            defer = self.defer is not None and self.defer(self.ft.step)
            self.ft.finish_step(defer=defer)
        finally:  # the attempt used up its batch, committed or not
            if self.expect_position is not None:
                self.expect_position += 1

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optim.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        return self.optim.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optim.load_state_dict(state_dict)

    @property  # type: ignore[override]
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optim.param_groups

    @property  # type: ignore[override]
    def state(self) -> Mapping[torch.Tensor, Any]:
        return self.optim.state
