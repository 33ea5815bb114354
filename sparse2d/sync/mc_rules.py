"""What managed-collision tables cannot be combined with, stated once.

A managed-collision (MC) table hands its rows to ids that change over training, and a 2D sync
merges identities by id before it averages rows (``sync.mc``). Three options assume a row
keeps its id across a sync, so they are refused with MC tables. The library checks them on
the unsharded module (``sync.mc.tables.check_managed_collision``) and when a pipeline is
built (``sync.mc.pipelines``); the trainer's config loader checks the same rules before any process starts.
It lives outside the ``sync.mc`` package, whose import loads torch and TorchRec: the launch
scripts' config check imports only this.
"""

from __future__ import annotations

MOMENTUM_SCALING = "the scaled accumulators would not follow ids that move between rows at a sync"
FULLY_SHARDED = "each replica would hold 1/G of rows whose ids differ per replica between syncs"
EARLY_LOOKUP = (
    "it looks up the next batch's embeddings before this batch's sync, and a sync of "
    "managed-collision tables moves ids between rows, so that lookup would read and update "
    "the wrong rows"
)
EARLY_LOOKUP_PIPELINES = ("semi_sync",)
"""Trainer ``train.pipeline`` values whose pipeline looks up batch ``i+1`` before batch ``i``'s
sync (TorchRec's ``TrainPipelineSemiSync``; ``TrainPipelineFusedSparseDist`` likewise)."""


def refusals(*, momentum_scaling: bool, fully_sharded: bool, pipeline: str = "none") -> list[str]:
    """``option (why)`` for each option that cannot run with MC tables (pure)."""
    out = []
    if momentum_scaling:
        out.append(f"momentum_scaling=True ({MOMENTUM_SCALING})")
    if fully_sharded:
        out.append(f"sharding_strategy=FULLY_SHARDED ({FULLY_SHARDED})")
    if pipeline in EARLY_LOOKUP_PIPELINES:
        out.append(f"pipeline={pipeline} ({EARLY_LOOKUP})")
    return out
