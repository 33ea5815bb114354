"""TorchRec's ``DMPCollection`` call, accepted unchanged next to sparse2d's short form.

The second positional argument tells the forms apart: an ``int`` (or ``"auto"``) is sparse2d's
sharding group size, a ``torch.device``/``str``/``None`` is TorchRec's device with TorchRec's
order after it. Keywords are the union of both, TorchRec's names with TorchRec's meaning, and
each all-reduce hook is called as the installed TorchRec calls it, read from its annotations.
Pure, so a bad call raises the same ``ConfigError`` on every rank before any collective.
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
import logging
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torchrec
from torchrec.distributed.model_parallel import DMPCollection as TorchRecDMPCollection
from torchrec.distributed.types import (
    DMPCollectionConfig,
    ModuleSharder,
    ShardingPlan,
    ShardingStrategy,
)

from sparse2d.errors import ConfigError
from sparse2d.sync.collectives import AllReduceHook

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


@dataclass(frozen=True, slots=True)
class HookContract:
    """How the installed TorchRec calls the all-reduce hook given at one door."""

    door: str
    """``"custom_all_reduce"`` (the constructor) or ``"set_all_reduce_hook"``."""
    roles: tuple[str, ...]
    """Positional arguments in TorchRec's order: ``("tensors",)`` or ``("pg", "tensors")``."""
    release: str
    """The installed ``torchrec.__version__``."""

    @property
    def call(self) -> str:
        """The call form, e.g. ``hook(pg, tensors)``."""
        return f"hook({', '.join(self.roles)})"

    def explain(self) -> str:
        """The call form and who calls it so, for error messages."""
        return (
            f"the hook is called as {self.call}, as TorchRec {self.release}'s {self.door} calls it"
        )


HOOK_DOORS: dict[str, tuple[Callable[..., Any], str]] = {
    "custom_all_reduce": (TorchRecDMPCollection.__init__, "custom_all_reduce"),
    "set_all_reduce_hook": (TorchRecDMPCollection.set_all_reduce_hook, "reduce_hook"),
}
"""Each door: the installed TorchRec function and the parameter whose annotation is the hook's."""


def hook_roles(annotation: object) -> tuple[str, ...] | None:
    """The roles of a ``Callable[[...], None]`` hook annotation (``Optional`` unwrapped):
    a ``ProcessGroup`` is ``"pg"``, a list of tensors ``"tensors"``; ``None`` if it is not
    a call form this module can adapt (one tensor list, at most one group)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        callables = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = callables[0] if len(callables) == 1 else None
    if typing.get_origin(annotation) is not collections.abc.Callable:
        return None
    params = typing.get_args(annotation)[0]
    if not isinstance(params, list):
        return None
    roles = tuple(_role(p) for p in params)
    if sorted(roles) not in (["tensors"], ["pg", "tensors"]):
        return None
    return roles


def _role(param: object) -> str | None:
    if isinstance(param, type) and issubclass(param, dist.ProcessGroup):
        return "pg"
    if typing.get_origin(param) is list and typing.get_args(param) == (torch.Tensor,):
        return "tensors"
    return None


@functools.cache
def installed_contract(door: str) -> HookContract:
    """The hook contract of ``door`` (a ``HOOK_DOORS`` key) in the installed TorchRec."""
    function, parameter = HOOK_DOORS[door]
    return read_contract(function, parameter, door)


def read_contract(function: Callable[..., Any], parameter: str, door: str) -> HookContract:
    """The contract ``function`` declares for its hook ``parameter``, read from its annotation;
    a ``ConfigError`` if it is not one ``hook_roles`` knows."""
    release = getattr(torchrec, "__version__", "?")
    try:
        annotation = typing.get_type_hints(function)[parameter]
    except (KeyError, NameError, TypeError):
        annotation = inspect.signature(function).parameters[parameter].annotation
    roles = hook_roles(annotation)
    if roles is None:
        raise ConfigError(
            f"TorchRec {release}'s {door} hook is typed {annotation!r}, a call form sparse2d "
            "does not know (it adapts hook(tensors) and hook(pg, tensors)); pass no hook, or "
            "install a TorchRec release sparse2d supports (docs/for_torchrec_users.md)."
        )
    return HookContract(door, roles, release)


def adapt_custom_all_reduce(hook: Callable[..., None] | None) -> AllReduceHook | None:
    """The constructor's ``custom_all_reduce``, called as the installed TorchRec calls it
    (``hook(tensors)`` in 1.8.0 and 1.9.2: the hook owns its process group)."""
    return _adapt(hook, "custom_all_reduce")


def adapt_set_all_reduce_hook(hook: Callable[..., None] | None) -> AllReduceHook | None:
    """``set_all_reduce_hook``'s hook, called as the installed TorchRec calls it: 1.8.0's
    ``hook(tensors)``, 1.9.2's ``hook(pg, tensors)`` with the context's replica group."""
    return _adapt(hook, "set_all_reduce_hook")


def _adapt(hook: Callable[..., None] | None, door: str) -> AllReduceHook | None:
    """Check ``hook`` fits ``door``'s installed contract and wrap it as sparse2d's
    ``hook(tensors, pg)``.

    The arguments go in TorchRec's order, never guessed from the hook's parameter names. A
    hook whose signature cannot be read is wrapped unchecked (a wrong one fails at its first
    call, never runs with its arguments swapped).
    """
    if hook is None:
        return None
    if not callable(hook):
        raise ConfigError(f"{door}={hook!r} is not callable.")
    contract = installed_contract(door)
    try:
        signature: inspect.Signature | None = inspect.signature(hook)
    except (TypeError, ValueError):
        signature = None
    if signature is not None:
        _check_arity(signature, contract)
    roles = contract.roles

    def in_torchrec_order(tensors: list[torch.Tensor], pg: dist.ProcessGroup) -> None:
        hook(*(pg if role == "pg" else tensors for role in roles))

    return in_torchrec_order


_COUNTS = {1: "one argument", 2: "two arguments"}
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _check_arity(signature: inspect.Signature, contract: HookContract) -> None:
    """Refuse a hook TorchRec could not call as ``contract.call``, or one naming more
    positional parameters than it passes (its extra argument would be missing or swapped)."""
    count = len(contract.roles)
    named = [p for p in signature.parameters.values() if p.kind in _POSITIONAL]
    if count == 1:
        fix = (
            "close over the group instead, e.g. model.set_all_reduce_hook(lambda tensors: "
            "my_hook(tensors, model.replica_pg))"
        )
    else:
        fix = (
            "write it as hook(pg, tensors), pg being the replica group (model.replica_pg), "
            "or give a hook(tensors) to the constructor's custom_all_reduce"
        )
    if len(named) > count:
        raise ConfigError(
            f"{contract.door}: hook{signature} takes {len(named)} positional parameters, but "
            f"{contract.explain()}; {fix}."
        )
    try:
        signature.bind(*[None] * count)
    except TypeError:
        raise ConfigError(
            f"{contract.door}: hook{signature} must take {_COUNTS[count]}: "
            f"{contract.explain()}; {fix}."
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
