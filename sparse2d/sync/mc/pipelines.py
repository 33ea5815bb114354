"""TorchRec pipelines that look up the next batch before this batch's sync.

``TrainPipelineSemiSync`` and ``TrainPipelineFusedSparseDist`` start batch ``i+1``'s
embedding lookup before batch ``i``'s backward and ``sync_embeddings``; batch ``i+1``'s fused
update then lands after that sync. When such a pipeline is built over a sparse2d model:

- managed-collision tables are refused: a sync of them moves ids between rows, so the
  early lookup would have read, and its backward would update, rows that now hold other ids
  (``TrainPipelineSparseDist`` pipelines only the input all-to-all of raw ids and is fine);
- touched-row sync engines are told to keep rows pending one more sync
  (``SyncPolicy.look_ahead``): rows looked up before sync ``i`` are updated after it.

The check runs when the pipeline is built: pure, on every rank, before any collective.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sparse2d.errors import ConfigError
from sparse2d.sync.mc import rules

_ORIGINAL = "_sparse2d_original"


def mc_tables_with_replicas(model: Any) -> list[str]:
    """Names of ``model``'s managed-collision tables synced over more than one replica."""
    policy = getattr(model, "sync_policy", None)
    policies = getattr(policy, "policies", [policy] if policy is not None else [])
    return sorted(
        t.name
        for p in policies
        if getattr(p, "mc", None) is not None and p.num_replicas > 1
        for t in p.mc.tables
    )


def refuse_early_lookup(model: Any, pipeline: str) -> None:
    tables = mc_tables_with_replicas(model)
    if tables:
        raise ConfigError(
            f"{pipeline} cannot drive managed-collision tables {tables}: {rules.EARLY_LOOKUP}. "
            "Use TrainPipelineSparseDist."
        )


def _guarded(init: Callable[..., Any], name: str) -> Callable[..., Any]:
    def guarded(self: Any, model: Any, *args: Any, **kwargs: Any) -> None:
        refuse_early_lookup(model, name)
        policy = getattr(model, "sync_policy", None)
        if policy is not None:
            policy.look_ahead()
        init(self, model, *args, **kwargs)

    setattr(guarded, _ORIGINAL, init)
    return guarded


def install_pipeline_guard() -> None:
    """Make the early-lookup pipelines refuse models with replicated MC tables and switch
    the model's touched-row tracking to look-ahead (idempotent)."""
    from torchrec.distributed.train_pipeline import train_pipelines as pipelines

    for name in ("TrainPipelineSemiSync", "TrainPipelineFusedSparseDist"):
        cls = getattr(pipelines, name, None)
        if cls is None or "__init__" not in cls.__dict__:
            continue
        init = cls.__dict__["__init__"]
        if not hasattr(init, _ORIGINAL):
            cls.__init__ = _guarded(init, cls.__name__)  # type: ignore[method-assign]
