"""How one training step runs: plainly, or through a TorchRec train pipeline.

``train.pipeline`` picks ``TrainPipelineSparseDist`` or ``TrainPipelineSemiSync``. Their own 2D
hook is left off: the loop calls ``model.maybe_sync(step)`` after each step, so every sync
option and report works at the same cadence and phase with or without a pipeline (the hook
would sync one batch off the phase checkpoints align to).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.profiler import record_function
from torchrec.distributed.train_pipeline.train_pipelines import (
    TrainPipelineSemiSync,
    TrainPipelineSparseDist,
)

from sparse2d.train.data import DataSource

Sync = Callable[[int], Any]
"""``model.maybe_sync``: the replica sync for step ``step`` (a ``SyncReport`` or None)."""
StepOut = tuple[torch.Tensor, torch.Tensor, Any]
"""(logits, labels, the step's sync report or None)."""


class PlainSteps:
    """forward, backward, dense optimizer step (the fused embedding update runs in backward)."""

    def __init__(self, model: Any, optimizer: torch.optim.Optimizer, data: DataSource) -> None:
        self.model, self.optimizer, self.data = model, optimizer, data

    def run(self, step: int, device: torch.device, sync: Sync) -> StepOut:
        """One step; ``sync(step)`` runs right after the backward (the fused embedding
        update), so a hidden sync (``parallel.sync.hide``) overlaps the dense optimizer step
        and the next batch's data and input all-to-all before its next lookup lands it."""
        with record_function("sparse2d.data"):
            batch = self.data.train(step)[0].to(device)
        loss, (_, logits, labels) = self.model(batch)
        loss.backward()
        with record_function("sparse2d.sync"):
            report = sync(step)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return logits, labels, report

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        yield


class PipelineSteps:
    """One ``progress()`` of a TorchRec train pipeline per step, over batches ``start..steps``."""

    def __init__(
        self,
        kind: str,
        model: Any,
        optimizer: torch.optim.Optimizer,
        data: DataSource,
        device: torch.device,
        start: int,
        steps: int | None,
    ) -> None:
        common: dict[str, Any] = {"dmp_collection_sync_interval_batches": None}
        if kind == "semi_sync":
            # start_batch=0: semi-sync from the first batch (TorchRec's default waits 900).
            self.pipeline: Any = TrainPipelineSemiSync(
                model, optimizer, device, start_batch=0, **common
            )
        else:
            self.pipeline = TrainPipelineSparseDist(model, optimizer, device, **common)
        positions = itertools.count(start) if steps is None else range(start, steps)
        self._batches = (data.train(position)[0] for position in positions)
        """Batches by data position (``steps=None``: without end, for fault tolerance, where
        a failed commit uses up a position too)."""

    def progress(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One ``progress()`` alone: (logits, labels). Under fault tolerance the optimizer
        wrapper runs quorum, sync and commit inside it (``sparse2d.ft.FTOptimizer``)."""
        _, logits, labels = self.pipeline.progress(self._batches)
        return logits, labels

    def run(self, step: int, device: torch.device, sync: Sync) -> StepOut:
        """One ``progress()``, then ``sync(step)``: the pipeline owns the backward-to-optimizer
        span, and the next ``progress()`` starts with the next batches' input all-to-all,
        which a hidden sync overlaps."""
        _, logits, labels = self.pipeline.progress(self._batches)
        with record_function("sparse2d.sync"):
            report = sync(step)
        return logits, labels, report

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Restore the model's own forwards (eval calls it directly); batches in flight stay."""
        self.pipeline.detach()
        try:
            yield
        finally:
            self.pipeline.attach()


def make_steps(
    kind: str,
    model: Any,
    optimizer: torch.optim.Optimizer,
    data: DataSource,
    device: torch.device,
    start: int,
    steps: int,
) -> PlainSteps | PipelineSteps:
    if kind == "none":
        return PlainSteps(model, optimizer, data)
    return PipelineSteps(kind, model, optimizer, data, device, start, steps)
