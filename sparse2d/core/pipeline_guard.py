"""TorchRec pipelines that look up the next batch before this batch's sync.

Under ``TrainPipelineSemiSync`` and ``TrainPipelineFusedSparseDist`` batch ``i+1``'s fused
update lands after batch ``i``'s sync: managed-collision tables are refused (a sync moves ids
between rows under the early lookup) and touched-row engines keep rows pending one more sync
(``SyncPolicy.look_ahead``). Checked when the pipeline is built, before any collective:
``DMPCollection`` adds ``before_early_lookup`` to the hooks those pipelines run
(``sparse2d.patches.torchrec_train_pipelines``, applied by ``apply_all``; idempotent).
"""

from __future__ import annotations

from typing import Any

from sparse2d.option_conflicts import LIBRARY_NAMES, check


def refuse_early_lookup(model: Any, pipeline: str) -> None:
    """Refuse managed-collision tables synced over more than one replica under an
    early-lookup pipeline (the rule is ``sparse2d.option_conflicts``'); ``pipeline``:
    TorchRec's class name."""
    tables = sorted(
        t.name
        for p in getattr(model, "sync_policies", [])
        if getattr(p, "mc", None) is not None and p.num_replicas > 1
        for t in p.mc.tables
    )
    check({"managed_collision": tables, "pipeline": pipeline}, LIBRARY_NAMES)


def before_early_lookup(model: Any, pipeline: str) -> None:
    """Run when an early-lookup pipeline is built over ``model``: refuse replicated MC
    tables, then switch the model's touched-row tracking to look-ahead."""
    refuse_early_lookup(model, pipeline)
    for policy in getattr(model, "sync_policies", []):
        policy.look_ahead()
