"""The trainer's loop run inside the shared test worlds instead of under a fresh torchrun.

A torchrun of 4 ranks costs ~20 CPU-seconds before the first step (the launcher and four
interpreters importing torch, TorchRec and FBGEMM); on a 2-core machine that is ~10 s of
wall time per launch, and the trainer tests launched ~20. The shared world's ranks already
hold those imports and a gloo process group, so a trainer test that checks what the loop
computes (AUC, resume, pipelines, checkpoints) runs the same ``Loop`` there. What only a
launch can show (the one-line failures, ``--profile``, torchrun restarts, the launchers)
keeps its real torchrun in ``tests/test_train.py`` and ``tests/test_launch.py``.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _train_on_this_rank(config: str, overrides: list[str]) -> tuple[dict[str, Any], str]:
    """One rank's part: the same steps as ``sparse2d.train.main`` after its process group."""
    import torch.distributed as dist

    from sparse2d.train.config import load_config
    from sparse2d.train.loop import Loop
    from sparse2d.train.model_builder import resolve_device

    cfg = load_config(config, overrides)
    cfg.check_runtime(dist.get_world_size(), dist.get_world_size())
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        loop = Loop(cfg, resolve_device(cfg))
        try:
            summary = loop.run()
        finally:
            loop.model.close()
        dist.barrier()  # as main(): every rank finished its collectives and file writes
    return summary, out.getvalue()


def train(world: Any, *overrides: str, config: str = "configs/tiny_cpu.yaml") -> tuple[dict, str]:
    """Run the trainer on every rank of ``world``; return rank 0's summary and stdout."""
    args = ["train.progress_bar=false", *overrides]
    results = world.run(_train_on_this_rank, os.path.join(ROOT, config), args, timeout=400)
    return results[0]
