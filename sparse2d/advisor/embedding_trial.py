"""``pick_group_size``: the ``L`` of ``DMPCollection(module, "auto")``, by timing the embedding part.

Every argument is first checked by the core's step 1 (``resolve_setup``, the same validation
as any construction); the advisor's cost model then picks ``L`` and a shortlist (rank 0 decides
and broadcasts, ``sparse2d.advisor.auto_pick``); then a short trial of the module's embedding
part decides between the shortlisted ``L``. It returns a ``TrialReport``: the choice and how it
was made. The public ``sparse2d.DMPCollection`` asks it in step 2 of its construction for
``"auto"`` and builds at ``report.chosen``; the core never imports the advisor.

Why a trial: the cost model alone trained 1.54x slower than the best ``L`` on a workload it
never saw (issue 57), while the trainer's trial on the job's own step stays within 1.05. A
``DMPCollection`` call has no step, but it knows what the embedding part needs: the tables (every
``EmbeddingBagCollection``/``EmbeddingCollection`` of the module), their fused optimizer
(``apply_optimizer_in_backward``) and a batch size (``planner_batch_size``, else the
advisor's ``DEFAULT_BATCH_SIZE``). So each shortlisted ``L`` (``shortlist`` with the
trainer's ``TrialOptions``) is built as a core ``DMPCollection`` of a fresh module holding only
those collections, on ``meta`` so each rank allocates its shards only, with the call's own
constraints, sharders, layout, strategy and sync options; it runs forward + backward (the
fused update) + ``maybe_sync`` on generated batches (per rank, the real batch size, one id
per feature and sample drawn uniformly over the table's rows) and is closed; the least median
step of the slowest rank wins (``measure_group_sizes``, which restores the RNG, so the
user's model is then initialized exactly as with that ``L`` given explicitly).

What the trial cannot reproduce keeps the model's pick: a ``plan`` (made for one ``L``),
``submodule_configs``, managed-collision tables, a ``custom_all_reduce`` (its calls would be
the trial's side effects), a sharded module type other than the two collections, or a
one-``L`` shortlist (nothing to compare); so does ``auto_options=TrialOptions(candidates=0)``.
Either way ``TrialReport.method`` says which it was, and rank 0 logs one line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torchrec import EmbeddingBagCollection, EmbeddingCollection, KeyedJaggedTensor

from sparse2d.advisor.auto_pick import (
    AUTO,
    DEFAULT_BATCH_SIZE,
    auto_candidates,
    workload_from_module,
)
from sparse2d.advisor.trial import TrialReport, measure_group_sizes
from sparse2d.advisor.trial_options import TrialOptions
from sparse2d.core.collection import DMPCollection
from sparse2d.core.collection_setup import Setup, resolve_setup
from sparse2d.errors import ConfigError

logger = logging.getLogger(__name__)

_COLLECTIONS = (EmbeddingBagCollection, EmbeddingCollection)


@dataclass(slots=True)
class _Collection:
    """One collection of the user's module, enough to rebuild it empty: its tables, whether
    its bags take per-id weights, and each parameter's in-backward optimizers."""

    configs: list[Any]
    pooled: bool
    weighted: bool
    optimizers: dict[str, list[tuple[type, dict[str, Any]]]]

    def build(self) -> nn.Module:
        """A fresh collection on ``meta`` with the same tables and fused optimizers."""
        from torch.distributed.optim import _apply_optimizer_in_backward

        meta = torch.device("meta")
        if self.pooled:
            module: nn.Module = EmbeddingBagCollection(
                tables=self.configs, is_weighted=self.weighted, device=meta
            )
        else:
            module = EmbeddingCollection(tables=self.configs, device=meta)
        for name, param in module.named_parameters():
            for cls, kwargs in self.optimizers.get(name, []):  # a copy: sharding edits it
                _apply_optimizer_in_backward(cls, [param], dict(kwargs))
        return module

    def batch(self, size: int, generator: torch.Generator) -> KeyedJaggedTensor:
        """One id per feature and sample, uniform over the feature's table."""
        keys, values = [], []
        for config in self.configs:
            for feature in config.feature_names:
                keys.append(feature)
                values.append(torch.randint(0, config.num_embeddings, (size,), generator=generator))
        ids = torch.cat(values)
        return KeyedJaggedTensor.from_lengths_sync(
            keys=keys,
            values=ids,
            lengths=torch.ones(len(keys) * size, dtype=torch.int32),
            weights=torch.ones(ids.numel()) if self.weighted else None,
        )


class EmbeddingPart(nn.Module):
    """The embedding collections of a model, alone; its output is the sum of every lookup
    (a scalar to run backward on, so each fused update runs)."""

    def __init__(self, collections: Sequence[_Collection]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(c.build() for c in collections)

    def forward(self, batches: list[KeyedJaggedTensor]) -> torch.Tensor:
        total = torch.zeros(())
        for part, kjt in zip(self.parts, batches, strict=True):
            out = part(kjt)
            if isinstance(out, dict):  # EmbeddingCollection: feature -> JaggedTensor
                for jagged in out.values():
                    total = total + jagged.values().sum()
            else:
                total = total + out.values().sum()
        return total


def _optimizers(module: nn.Module) -> dict[str, list[tuple[type, dict[str, Any]]]]:
    """Each parameter's in-backward optimizers (``apply_optimizer_in_backward``), copied:
    TorchRec's sharding edits the kwargs it is given, and the user's stay as they are."""
    return {
        name: [
            (cls, dict(kwargs))
            for cls, kwargs in zip(
                getattr(p, "_optimizer_classes", []), getattr(p, "_optimizer_kwargs", [])
            )
        ]
        for name, p in module.named_parameters()
    }


def embedding_collections(
    module: nn.Module, sharded_types: Sequence[type]
) -> tuple[list[_Collection], str | None]:
    """The module's collections, or why they cannot be rebuilt from their tables."""
    found = []
    for sub in module.modules():
        if type(sub) in _COLLECTIONS:
            pooled = isinstance(sub, EmbeddingBagCollection)
            configs = sub.embedding_bag_configs() if pooled else sub.embedding_configs()
            weighted = bool(pooled and sub.is_weighted())
            found.append(_Collection(list(configs), pooled, weighted, _optimizers(sub)))
        elif isinstance(sub, _COLLECTIONS) or type(sub) in sharded_types:
            return [], f"{type(sub).__name__} cannot be rebuilt from its tables"
    if not found:
        return [], "no EmbeddingBagCollection/EmbeddingCollection"
    return found, None


def why_not_measured(call: Any, has_mc: bool, options: TrialOptions) -> str | None:
    """What in the call keeps the model's pick (None: the trial can run)."""
    reasons = (
        (options.candidates == 0, "auto_options.candidates=0"),
        (call.plan is not None, "a plan was given (made for one L)"),
        (bool(call.submodule_configs), "submodule_configs were given"),
        (has_mc, "managed-collision tables"),
        (call.custom_all_reduce is not None, "custom_all_reduce given (the trial would call it)"),
    )
    return next((why for refused, why in reasons if refused), None)


def check_auto_options(value: object, group_size: object = AUTO) -> TrialOptions:
    """``auto_options``: how much the trial may spend (default ``TrialOptions()``). Given
    beside a fixed ``L`` it would do nothing, so it is refused rather than ignored."""
    if value is None:
        return TrialOptions()
    if group_size != AUTO:
        raise ConfigError(
            f"auto_options={value!r} was given with sharding_group_size={group_size!r}; "
            "it only tunes the trial of sharding_group_size='auto'. Drop auto_options, or "
            "pass 'auto' to let the trial choose L."
        )
    if not isinstance(value, TrialOptions):
        raise ConfigError(
            f"auto_options={value!r} must be a sparse2d.TrialOptions (e.g. "
            "TrialOptions(candidates=0) to keep the model's pick without a trial)."
        )
    return value


def pick_group_size(
    module: nn.Module,
    *,
    auto_options: TrialOptions | None = None,
    build: Callable[..., Any] = DMPCollection,
    **kwargs: Any,
) -> TrialReport:
    """The ``L`` that ``DMPCollection(module, "auto", **kwargs)`` builds, and how it was chosen.

    ``kwargs`` are the constructor's keywords (``device``, ``constraints``, ``sharders``,
    ``replica_layout``, ``global_pg``, ``planner_batch_size``, ``sync_options``, ...);
    ``auto_options`` bounds the trial (``TrialOptions(candidates=0)``: the model's pick, nothing
    built); ``build(module, L, **kwargs)`` builds each candidate (the core ``DMPCollection``).
    Collective over ``global_pg``; the same report on every rank. ``module`` is not sharded.
    """
    size = kwargs.pop("sharding_group_size", AUTO)
    if size != AUTO:
        raise ConfigError(
            f"pick_group_size chooses sharding_group_size; got sharding_group_size={size!r}."
        )
    options = check_auto_options(auto_options)
    setup = resolve_setup(module, (), kwargs | {"sharding_group_size": AUTO})
    return choose_group_size(module, setup, options, build)


def choose_group_size(
    module: nn.Module, setup: Setup, options: TrialOptions, build: Callable[..., Any]
) -> TrialReport:
    """``pick_group_size`` for a call validated by the core's step 1 (``resolve_setup``): the
    advice (rank 0 decides, all receive), then the trial where it can measure. A candidate
    whose ``L`` an argument does not fit (a ``node_group_size`` that does not divide it) is
    skipped by the trial; the chosen ``L`` is checked by the construction's step 2."""
    call = setup.call
    pick, candidates = auto_candidates(
        lambda: workload_from_module(
            module,
            call.planner_batch_size,
            call.sync_options,
            setup.replica_layout,
            call.constraints,
        ),
        setup.world_size,
        setup.device,
        setup.pg,
        options,
    )
    period = getattr(call.sync_options, "every", 1)
    sharded_types = [s.module_type for s in setup.sharders]
    collections, why = embedding_collections(module, sharded_types)
    why = why_not_measured(call, setup.has_mc, options) or why
    if why is None and len(candidates) < 2:
        why = f"the shortlist holds one L ({pick})"
    if why is not None:
        report = TrialReport(chosen=pick, model_pick=pick, options=options, period=period)
        report.method, report.why_model = "model", why
    else:
        report = _measure(collections, setup, build, pick, candidates, options, period)
    if dist.get_rank(setup.pg) == 0:
        logger.info("[sparse2d] auto sharding_group_size=%d (%s)", report.chosen, report.summary())
    return report


def _measure(
    collections: list[_Collection],
    setup: Setup,
    build: Callable[..., Any],
    pick: int,
    candidates: list[tuple[int, float]],
    options: TrialOptions,
    period: int,
) -> TrialReport:
    call = setup.call
    batch_size = call.planner_batch_size or DEFAULT_BATCH_SIZE
    generator = torch.Generator().manual_seed(1_000_003 * dist.get_rank(setup.pg) + 57)
    batches = [
        [c.batch(batch_size, generator).to(setup.device) for c in collections]
        for _ in range(options.steps_for(period))
    ]

    def candidate(group_size: int) -> Any:
        return build(
            EmbeddingPart(collections),
            group_size,
            device=setup.device,
            constraints=call.constraints,
            sharders=setup.sharders,
            replica_layout=setup.replica_layout,
            global_pg=call.global_pg,
            node_group_size=call.node_group_size,
            planner_batch_size=batch_size,
            sync_options=call.sync_options,
            sharding_strategy=call.sharding_strategy,
        )

    def step(model: Any, i: int) -> None:
        model(batches[i]).backward()
        model.maybe_sync(i)

    return measure_group_sizes(
        candidate, step, candidates, options, pg=setup.pg, model_pick=pick, period=period
    )
