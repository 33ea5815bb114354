"""TorchRec train pipelines with managed-collision tables (``sparse2d.core.pipeline_guard``):
``TrainPipelineSparseDist`` syncs them through our ``sync()``; the pipelines that look up the
next batch before this batch's sync are refused when built."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.harness import DistWorld
from tests.mc_models import build_mc_model
from tests.test_managed_collision_paths import mc_max_diff


class _PipelineModel(torch.nn.Module):
    """``forward(batch) -> (loss, prediction)``, the contract of TorchRec's train pipelines."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        pred = self.model(batch.sparse_features, batch.dense_features)
        return ((pred - batch.labels) ** 2).mean(), pred.detach()


def check_torchrec_pipeline() -> list[float]:
    """TorchRec's TrainPipelineSparseDist syncs every batch through our ``sync()``."""
    from torchrec.datasets.utils import Batch
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from sparse2d import DMPCollection
    from tests.mc_models import mc_batch

    with DMPCollection(_PipelineModel(build_mc_model(bagged=True)), 2, device="cpu") as model:
        dense = torch.optim.SGD(
            [p for _, p in in_backward_optimizer_filter(model.named_parameters())], lr=0.05
        )
        pipeline = TrainPipelineSparseDist(
            model, dense, torch.device("cpu"), dmp_collection_sync_interval_batches=1
        )
        data = []
        for step in range(5):
            kjt, dense_x, target = mc_batch(step, dist.get_rank())
            data.append(Batch(dense_features=dense_x, sparse_features=kjt, labels=target))
        it, diffs = iter(data), []
        for _ in data:
            pipeline.progress(it)
            diffs.append(mc_max_diff(model))
        return diffs


def test_torchrec_pipeline_syncs_mc_tables(world4: DistWorld) -> None:
    diffs = world4.run(check_torchrec_pipeline)[0]
    assert len(diffs) == 5 and all(d == 0.0 for d in diffs), diffs


def check_early_lookup_pipelines_refused() -> list[str]:
    from torchrec.distributed.train_pipeline.train_pipelines import (
        TrainPipelineFusedSparseDist,
        TrainPipelineSemiSync,
    )

    from sparse2d import DMPCollection
    from sparse2d.errors import ConfigError

    messages = []
    with DMPCollection(_PipelineModel(build_mc_model(bagged=True)), 2, device="cpu") as model:
        dense = torch.optim.SGD(model.parameters(), lr=0.05)
        for cls in (TrainPipelineSemiSync, TrainPipelineFusedSparseDist):
            with pytest.raises(ConfigError) as error:
                cls(model, dense, torch.device("cpu"))
            messages.append(str(error.value))
    return messages


def test_early_lookup_pipelines_refused(world4: DistWorld) -> None:
    """Semi-sync / fused pipelines look up batch i+1 before batch i's sync moves ids."""
    messages = world4.run(check_early_lookup_pipelines_refused)[0]
    assert "TrainPipelineSemiSync" in messages[0] and "m0" in messages[0]
    assert "TrainPipelineFusedSparseDist" in messages[1]
