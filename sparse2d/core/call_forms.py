"""TorchRec's ``DMPCollection`` call, accepted unchanged next to sparse2d's short form.

Two call forms share one constructor, told apart by the second positional argument:

* sparse2d: ``DMPCollection(module, L, *, device=..., constraints=..., ...)``: an ``int``
  (or ``"auto"``) second argument is the sharding group size;
* TorchRec: ``DMPCollection(module, device, plan, world_size, sharding_group_size,
  global_pg, sharding_strategy, ...)``: a ``torch.device``/``str`` (or ``None``) second
  argument is the device and the rest follows TorchRec's order (1.8.0 and 1.9.2 agree).

Keywords are the union of both; TorchRec's names keep TorchRec's meaning
(``use_inter_host_allreduce=True`` is ``replica_layout="inter_host"``, a one-argument
``custom_all_reduce(tensors)`` is TorchRec's hook, the only order accepted).
Everything here is pure, so a bad call raises the same ``ConfigError`` on every rank
before any collective.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torchrec.distributed.types import (
    DMPCollectionConfig,
    ModuleSharder,
    ShardingPlan,
    ShardingStrategy,
)

from sparse2d.errors import ConfigError
from sparse2d.sync.transport.collectives import AllReduceHook

logger = logging.getLogger(__name__)

TORCHREC_POSITIONAL: tuple[str, ...] = (
    "device",
    "plan",
    "world_size",
    "sharding_group_size",
    "global_pg",
    "sharding_strategy",
    "node_group_size",
    "sharders",
    "init_data_parallel",
    "init_parameters",
    "data_parallel_wrapper",
    "use_inter_host_allreduce",
    "custom_all_reduce",
    "submodule_configs",
    "rs_awaitable_hook_module",
    "use_sharded_relay",
)
"""TorchRec's ``DMPCollection.__init__`` parameters after ``module``, in order."""


@dataclass(kw_only=True, slots=True)
class CollectionArgs:
    """Every ``DMPCollection`` argument after parsing either call form (see the class doc)."""

    sharding_group_size: int | str | None = None
    device: torch.device | str | None = None
    plan: ShardingPlan | None = None
    world_size: int | None = None
    global_pg: dist.ProcessGroup | None = None
    sharding_strategy: ShardingStrategy | str = ShardingStrategy.DEFAULT
    node_group_size: int | None = None
    sharders: list[ModuleSharder[nn.Module]] | None = None
    init_data_parallel: bool = True
    init_parameters: bool = True
    data_parallel_wrapper: Any = None
    use_inter_host_allreduce: bool | None = None
    custom_all_reduce: Callable[..., None] | None = None
    submodule_configs: list[DMPCollectionConfig] | None = None
    rs_awaitable_hook_module: str | None = None
    use_sharded_relay: bool = False
    constraints: dict[str, Any] | None = None
    replica_layout: str | None = None
    planner_batch_size: int | None = None
    sync_options: Any = None
    plan_store: Any = None

    def as_kwargs(self) -> dict[str, Any]:
        """Every argument by keyword (the same objects, not copies): the call made again."""
        return {name: getattr(self, name) for name in _NAMES}


_NAMES = frozenset(CollectionArgs.__dataclass_fields__)


def _is_group_size(value: object) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or value == "auto"


def parse_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> CollectionArgs:
    """Map the positional and keyword arguments after ``module`` onto ``CollectionArgs``."""
    unknown = sorted(set(kwargs) - _NAMES)
    if unknown:
        raise TypeError(
            f"DMPCollection got unexpected keyword argument(s) {unknown}; accepted: "
            f"{sorted(_NAMES)}"
        )
    if args and _is_group_size(args[0]):
        names: tuple[str, ...] = ("sharding_group_size",)
        form = "sparse2d (module, sharding_group_size, *, ...)"
    else:
        names = TORCHREC_POSITIONAL
        form = "TorchRec (module, device, plan, world_size, sharding_group_size, global_pg, ...)"
    if len(args) > len(names):
        raise TypeError(
            f"DMPCollection takes at most {len(names)} positional arguments after module in "
            f"the {form} form; got {len(args)}. Pass the rest by keyword."
        )
    bound = dict(zip(names, args, strict=False))
    twice = sorted(set(bound) & set(kwargs))
    if twice:
        raise TypeError(f"DMPCollection got multiple values for argument(s) {twice} ({form})")
    return CollectionArgs(**bound, **kwargs)


def resolve_strategy(value: ShardingStrategy | str) -> ShardingStrategy:
    """TorchRec's ``ShardingStrategy`` (or its value string)."""
    try:
        strategy = ShardingStrategy(value)
    except ValueError:
        choices = [s.value for s in ShardingStrategy]
        raise ConfigError(
            f"sharding_strategy={value!r} is unknown; use a torchrec ShardingStrategy ({choices})."
        ) from None
    return strategy


def resolve_layout(replica_layout: str | None, use_inter_host_allreduce: bool | None) -> str:
    """``replica_layout`` from either name; both given must agree."""
    if use_inter_host_allreduce is not None and not isinstance(use_inter_host_allreduce, bool):
        raise ConfigError(
            f"use_inter_host_allreduce={use_inter_host_allreduce!r} must be True or False."
        )
    implied = (
        None
        if use_inter_host_allreduce is None
        else ("inter_host" if use_inter_host_allreduce else "intra_host")
    )
    if replica_layout is None:
        return implied or "intra_host"
    if implied is not None and implied != replica_layout:
        raise ConfigError(
            f"replica_layout={replica_layout!r} contradicts use_inter_host_allreduce="
            f"{use_inter_host_allreduce} (which means {implied!r}); pass only one of them."
        )
    return replica_layout


def check_world_size(world_size: int | None, actual: int) -> None:
    """TorchRec's explicit ``world_size`` must match the process group's."""
    if world_size is None:
        return
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size != actual:
        raise ConfigError(
            f"world_size={world_size!r} but the process group has {actual} ranks; pass "
            f"world_size={actual} (or leave it out: sparse2d reads it from the group)."
        )


def adapt_all_reduce(hook: Callable[..., None] | None) -> AllReduceHook | None:
    """Accept TorchRec's all-reduce hook, ``hook(tensors)``, the one order there is.

    TorchRec's ``DMPCollection`` (1.8.0 and its main branch, whose test utilities the 1.9.2
    wheel ships unchanged) calls ``custom_all_reduce(tensors)``: the hook owns its process
    group (sparse2d's is ``model.replica_pg``) and must average the tensors in place. A hook
    with a second positional parameter (sparse2d's former ``hook(tensors, replica_pg)``, or a
    ``hook(pg, tensors)``) is refused in one line rather than called with its arguments
    guessed from their names; one whose signature cannot be read is called as ``hook(tensors)``
    (a two-argument one then fails at its first call, never runs with its arguments swapped).
    """
    if hook is None:
        return None
    if not callable(hook):
        raise ConfigError(f"custom_all_reduce={hook!r} is not callable.")
    try:
        signature: inspect.Signature | None = inspect.signature(hook)
    except (TypeError, ValueError):
        signature = None
    if signature is not None:
        _check_one_argument(signature)

    def one_argument(tensors: list[torch.Tensor], _pg: dist.ProcessGroup) -> None:
        hook(tensors)

    return one_argument


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _check_one_argument(signature: inspect.Signature) -> None:
    """Refuse a hook TorchRec could not call as ``hook(tensors)`` or that names a second
    positional parameter (an old-order hook: its group would be missing or swapped)."""
    named = [p for p in signature.parameters.values() if p.kind in _POSITIONAL]
    if len(named) > 1:
        raise ConfigError(
            f"custom_all_reduce{signature} takes {len(named)} positional parameters, but the "
            "hook is called as hook(tensors), like TorchRec's DMPCollection (the hook owns its "
            "process group); close over the group instead, e.g. model.set_all_reduce_hook("
            "lambda tensors: my_hook(tensors, model.replica_pg))."
        )
    try:
        signature.bind(None)
    except TypeError:
        raise ConfigError(
            f"custom_all_reduce{signature} must take one argument, the list of tensors to "
            "average in place (TorchRec's hook(tensors))."
        ) from None


def note_ignored(args: CollectionArgs) -> None:
    """Log TorchRec options that have no effect here, so a ported script is not surprised."""
    if args.use_sharded_relay:
        logger.warning(
            "[sparse2d] use_sharded_relay=True is an NCCL/RCCLX transport option; sparse2d "
            "syncs with its own all-reduce (TorchRec falls back the same way without RCCLX)."
        )
    if args.rs_awaitable_hook_module is not None:
        logger.warning(
            "[sparse2d] rs_awaitable_hook_module=%r only matters for FULLY_SHARDED; ignored.",
            args.rs_awaitable_hook_module,
        )
