"""How one training step runs: plainly, or through a TorchRec train pipeline.

``train.pipeline`` picks TorchRec's ``TrainPipelineSparseDist`` (the input all-to-all of
the next batches overlaps this step) or ``TrainPipelineSemiSync`` (the next batch's
embedding lookup too). The pipelines' own 2D hook (``dmp_collection_sync_interval_batches``)
is left off: the loop syncs through ``model.maybe_sync(step)`` right after each step, so
every ``parallel.sync`` option (overlap, delayed state, engines) and the per-sync reports
keep working, at the same cadence and phase with or without a pipeline. (A pipeline's
hook would call the blocking ``model.sync()`` after batches ``0, N, 2N, ...``, one batch
off the policy's ``N-1, 2N-1, ...`` that checkpoints align to.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from sparse2d.train.data import DataSource


class PlainSteps:
    """forward, backward, dense optimizer step (the fused embedding update runs in backward)."""

    def __init__(self, model: Any, optimizer: torch.optim.Optimizer, data: DataSource) -> None:
        self.model, self.optimizer, self.data = model, optimizer, data

    def run(self, step: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        batch, _ = self.data.train(step)
        loss, (_, logits, labels) = self.model(batch.to(device))
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return logits, labels

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
        steps: int,
    ) -> None:
        from torchrec.distributed.train_pipeline.train_pipelines import (
            TrainPipelineSemiSync,
            TrainPipelineSparseDist,
        )

        common: dict[str, Any] = {"dmp_collection_sync_interval_batches": None}
        if kind == "semi_sync":
            # start_batch=0: semi-sync from the first batch (TorchRec's default waits 900).
            self.pipeline: Any = TrainPipelineSemiSync(
                model, optimizer, device, start_batch=0, **common
            )
        else:
            self.pipeline = TrainPipelineSparseDist(model, optimizer, device, **common)
        self._batches = (data.train(step)[0] for step in range(start, steps))

    def run(self, step: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        _, logits, labels = self.pipeline.progress(self._batches)
        return logits, labels

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
