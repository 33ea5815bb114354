"""Every ``nn.Module`` surface of a FULLY_SHARDED model stays valid between steps.

Between steps the TBEs' own storage is freed, so a per-table view (``state_dict()`` shards,
``named_parameters()``, the fused optimizer's state) would read freed memory: a segfault, not
an error. Each surface here first materializes the full buffers (collective over the replica
group); they stay until the next forward re-slices them, keeping what was written
(``FullyShardedEmbeddings.settle``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.types import ShardedModule
from torchrec.optim.keyed import KeyedOptimizer, OptimizerWrapper

from sparse2d.core.fully_sharded.schedule import FullyShardedEmbeddings
from sparse2d.core.resources import Resources

if TYPE_CHECKING:
    from sparse2d.core.contexts import ShardingContext

logger = logging.getLogger(__name__)


class SurfaceGuard:
    """Runs before each tensor-handing surface of a ``DMPCollection`` (``state_dict``,
    ``load_state_dict``, ``named_parameters``, ``bare_named_parameters``, ``named_buffers``)
    and of its fused optimizer: in-flight syncs land first (state dict and load only) and,
    under FULLY_SHARDED, the full buffers are materialized.

    Holds what it needs (the model's resources, how to land its syncs, the FULLY_SHARDED
    schedule), not the model. Cost under FULLY_SHARDED: a surface called between steps
    gathers the full buffers once (the memory of DEFAULT until the next forward); repeated
    calls before that are free.
    """

    def __init__(
        self,
        resources: Resources,
        land: Callable[[], object],
        fully_sharded: FullyShardedEmbeddings | None,
    ) -> None:
        self.resources = resources
        self.land = land
        self.fully_sharded = fully_sharded

    def __call__(self, surface: str, land: bool = False) -> None:
        if land:
            # Overlapped/hidden/delayed syncs land first (local waits): a state dict shows the
            # values the next forward will use, and a load is not overwritten by a landing.
            self.land()
        if self.fully_sharded is None:
            return
        self.resources.check_open(f"read {surface} (its FULLY_SHARDED buffers are freed)")
        self.fully_sharded.materialize(surface)


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


def slice_fully_sharded(
    model: nn.Module,
    sliced: list[ShardingContext],
    pg: dist.ProcessGroup,
    resources: Resources,
) -> FullyShardedEmbeddings | None:
    """Keep this replica's 1/G slice of the ``sliced`` contexts' buffers (FULLY_SHARDED with
    replicas; none: ``None``) and guard their sharded modules; ``resources`` releases both."""
    if not sliced:
        return None
    fully_sharded = FullyShardedEmbeddings([(c.shards, c.replica_pg) for c in sliced], pg)
    resources.callback(fully_sharded.close)
    for handle in guard_sharded_modules(model, fully_sharded):
        resources.callback(handle.remove)
    logger.info("[sparse2d] FULLY_SHARDED: %s", [(c.name, c.num_replicas) for c in sliced])
    return fully_sharded
