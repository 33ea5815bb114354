"""Every ``nn.Module`` surface of a FULLY_SHARDED model stays valid between steps.

Between steps a FULLY_SHARDED replica keeps 1/G of each fused TBE buffer and frees the
TBE's own storage, so each per-table view TorchRec hands out (the ``state_dict()`` shards,
``named_parameters()``, the fused optimizer's state) would read freed memory: a segfault,
not a Python error. Each surface here first materializes the full buffers (collective over
the replica group, like ``torch.distributed.checkpoint``: every rank calls it); they stay
until the next forward re-slices them and keeps what was written meanwhile
(``FullyShardedEmbeddings.settle``). Surfaces that read no embedding storage (``print``,
``train()``/``eval()``) need nothing; pickling and ``copy.deepcopy`` are refused by
``DMPCollection.__getstate__`` for every strategy (process groups cannot be copied).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn
from torchrec.distributed.types import ShardedModule
from torchrec.optim.keyed import KeyedOptimizer, OptimizerWrapper

from sparse2d.sync.fully_sharded.schedule import FullyShardedEmbeddings


class GuardedSurfaces:
    """``DMPCollection`` mixin: the tensor-handing surfaces land in-flight syncs (state dict
    and load only) and, under FULLY_SHARDED, materialize first.

    Cost under FULLY_SHARDED: a surface called between steps gathers the full buffers once
    (the memory of DEFAULT until the next forward); repeated calls before that are free.
    """

    def _before_surface(self, surface: str, land: bool = False) -> None:
        if land and "_resources" in self.__dict__ and not self.closed:  # type: ignore[attr-defined]
            # Overlapped/hidden/delayed syncs land first (local waits): a state dict shows the
            # values the next forward will use, and a load is not overwritten by a landing.
            self.sync_policy.finish()  # type: ignore[attr-defined]
        fully_sharded = self.__dict__.get("_fully_sharded")  # absent while constructing
        if fully_sharded is None:
            return
        self._resources.check_open(f"read {surface} (its FULLY_SHARDED buffers are freed)")  # type: ignore[attr-defined]
        fully_sharded.materialize(surface)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self._before_surface("state_dict()", land=True)
        return super().state_dict(*args, **kwargs)  # type: ignore[misc]

    def load_state_dict(self, state_dict: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
        """Load, then forget the sync references (bf16 deltas, momentum scaling, managed
        collision) taken from the old values. Call it on every rank, as every load."""
        self._before_surface("load_state_dict()", land=True)
        result = super().load_state_dict(state_dict, *args, **kwargs)  # type: ignore[misc]
        self.sync_policy.reset()  # type: ignore[attr-defined]
        return result

    def named_parameters(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, nn.Parameter]]:
        self._before_surface("named_parameters()")
        return super().named_parameters(*args, **kwargs)  # type: ignore[misc]

    def bare_named_parameters(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, Any]]:
        self._before_surface("bare_named_parameters()")
        return super().bare_named_parameters(*args, **kwargs)  # type: ignore[misc]

    def named_buffers(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, torch.Tensor]]:
        self._before_surface("named_buffers()")
        return super().named_buffers(*args, **kwargs)  # type: ignore[misc]


class GuardedOptimizer(OptimizerWrapper):
    """The model's fused optimizer behind the same guard as the model's surfaces: in-flight
    syncs land before its state is read or loaded, and under FULLY_SHARDED the per-table
    state and parameter views are materialized first (``state``, ``params``, ``state_dict``,
    ``load_state_dict``)."""

    def __init__(self, optimizer: KeyedOptimizer, guard: Callable[[str, bool], None]) -> None:
        self._guard = guard
        super().__init__(optimizer)

    @property  # type: ignore[override]
    def state(self) -> Mapping[Any, Any]:
        self._guard("fused_optimizer.state", False)
        return self._state

    @state.setter
    def state(self, value: Mapping[Any, Any]) -> None:
        self._state = value

    @property  # type: ignore[override]
    def params(self) -> Mapping[str, Any]:
        self._guard("fused_optimizer.params", False)
        return self._params

    @params.setter
    def params(self, value: Mapping[str, Any]) -> None:
        self._params = value

    def state_dict(self) -> dict[str, Any]:
        self._guard("fused_optimizer.state_dict()", True)
        return super().state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self._guard("fused_optimizer.load_state_dict()", True)
        super().load_state_dict(state_dict)

    def __getattr__(self, name: str) -> Any:
        """What TorchRec's ``CombinedOptimizer`` offers beyond ``KeyedOptimizer``
        (``optimizers``, ...)."""
        if name.startswith("__") or "_optimizer" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["_optimizer"], name)


def guard_sharded_modules(
    model: nn.Module, fully_sharded: FullyShardedEmbeddings
) -> list[torch.utils.hooks.RemovableHandle]:
    """Materialize when a sharded module is reached directly (``model.module.ebc.state_dict()``);
    returns the hook handles."""
    tbes = {id(k.tbe) for k in fully_sharded.kernels}
    handles = []
    for module in model.modules():
        if not isinstance(module, ShardedModule):
            continue
        if not any(id(m) in tbes for m in module.modules()):
            continue
        handles.append(
            module.register_state_dict_pre_hook(
                lambda *_: fully_sharded.materialize("a sharded module's state_dict()")
            )
        )
        handles.append(
            module.register_load_state_dict_pre_hook(
                lambda *_: fully_sharded.materialize("a sharded module's load_state_dict()")
            )
        )
    return handles
