"""Argument checks that run on every rank before any collective.

Every check here is a pure function of the arguments and the (identical on
every rank) model, so all ranks raise the same error and no rank is left
waiting in a collective that the others never join.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec.distributed.types import ModuleSharder
from torchrec.distributed.utils import optimizer_type_to_emb_opt_type

from sparse2d.errors import ConfigError, UnsupportedOptimizerError
from sparse2d.option_conflicts import LIBRARY_NAMES, check

logger = logging.getLogger(__name__)

CPU_OPTIMIZERS: tuple[EmbOptimType, ...] = (
    EmbOptimType.EXACT_SGD,
    EmbOptimType.EXACT_ADAGRAD,
    EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    EmbOptimType.EMAINPLACE_ROWWISE_ADAGRAD,
)
"""Fused optimizers FBGEMM's CPU TBE implements (``use_cpu`` branch of its constructor)."""

CPU_OPTIMIZER_HINT = (
    "torch.optim.SGD (EXACT_SGD), torch.optim.Adagrad (EXACT_ADAGRAD), "
    "torchrec.optim.RowWiseAdagrad (EXACT_ROWWISE_ADAGRAD) or "
    "EMAINPLACE_ROWWISE_ADAGRAD via fused_params"
)


def resolve_device(device: torch.device | str | None) -> torch.device:
    """``cuda:LOCAL_RANK`` when CUDA is available, else ``cpu``; a bare ``"cuda"`` also means
    this process's local GPU. Rejects devices that cannot be used here."""
    local_gpu = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    if device is None:
        return local_gpu if torch.cuda.is_available() else torch.device("cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"device={str(device)!r} but CUDA is not available on this machine; use 'cpu', "
            "or leave the device unset (auto) to pick automatically."
        )
    if resolved.type not in ("cpu", "cuda"):
        raise ConfigError(f"device={str(device)!r} is not supported; use 'cpu' or 'cuda'.")
    return local_gpu if resolved.type == "cuda" and resolved.index is None else resolved


def check_process_group(global_pg: dist.ProcessGroup | None) -> tuple[int, int]:
    """Return ``(world_size, rank)`` of the job; the group must span the whole world."""
    if not dist.is_available() or not dist.is_initialized():
        raise ConfigError(
            "No default process group is initialized: call "
            "torch.distributed.init_process_group('gloo' or 'nccl') before DMPCollection "
            "(torchrun sets the environment it needs)."
        )
    world_size = dist.get_world_size()
    if global_pg is not None and dist.get_world_size(global_pg) != world_size:
        raise ConfigError(
            f"global_pg has {dist.get_world_size(global_pg)} ranks but the job has {world_size}; "
            "the 2D mesh spans the whole world, so pass the default group (global_pg=None)."
        )
    return world_size, dist.get_rank()


def check_shardable(module: nn.Module, sharders: list[ModuleSharder[nn.Module]]) -> list[str]:
    """Return the paths of shardable submodules; raise if there is none."""
    types = tuple(s.module_type for s in sharders)
    paths = [name for name, sub in module.named_modules() if isinstance(sub, types)]
    if not paths:
        raise ConfigError(
            f"The model ({type(module).__name__}) has no module sparse2d can shard: expected a "
            f"{' or '.join(t.__name__ for t in types)} somewhere inside it. Wrap dense-only "
            "models in DistributedDataParallel instead."
        )
    return paths


def embedding_optimizer_types(
    module: nn.Module, sharders: list[ModuleSharder[nn.Module]]
) -> dict[str, EmbOptimType | None]:
    """Map each embedding parameter to the fused optimizer it will be sharded with."""
    types = tuple(s.module_type for s in sharders)
    fused: dict[type, dict[str, Any]] = {
        s.module_type: dict(s.fused_params or {}) for s in sharders
    }
    result: dict[str, EmbOptimType | None] = {}
    for path, sub in module.named_modules():
        if not isinstance(sub, types):
            continue
        for name, param in sub.named_parameters():
            classes = getattr(param, "_optimizer_classes", [None])
            kwargs = getattr(param, "_optimizer_kwargs", [{}])[0]
            full = f"{path}.{name}" if path else name
            explicit = kwargs["optimizer"] if "optimizer" in kwargs else None
            if explicit is None and "optimizer" in fused[type(sub)]:
                explicit = fused[type(sub)]["optimizer"]
            if explicit is not None:
                result[full] = EmbOptimType(explicit)
            elif classes[0] is not None:
                try:
                    result[full] = optimizer_type_to_emb_opt_type(classes[0])
                except ValueError as error:
                    raise UnsupportedOptimizerError(
                        f"{full} has fused optimizer {classes[0].__name__}, which FBGEMM cannot "
                        f"fuse; use {CPU_OPTIMIZER_HINT}."
                    ) from error
            else:
                result[full] = None
    return result


def check_optimizers(
    module: nn.Module, sharders: list[ModuleSharder[nn.Module]], device: torch.device
) -> None:
    """Reject fused optimizers the CPU kernels lack, naming the supported ones; warn when no
    embedding optimizer is configured at all (FBGEMM's default would silently apply)."""
    optimizers = embedding_optimizer_types(module, sharders)
    if not any(optimizers.values()):
        logger.warning(
            "[sparse2d] no fused embedding optimizer given: FBGEMM's default applies. Call "
            "apply_optimizer_in_backward(...) on the embedding parameters before wrapping "
            "(note: copy.deepcopy drops that setting)."
        )
    if device.type != "cpu":
        return
    for name, optim in optimizers.items():
        if optim is not None and optim not in CPU_OPTIMIZERS:
            raise UnsupportedOptimizerError(
                f"{name} uses fused optimizer {optim.name}, which FBGEMM's CPU kernels do not "
                f"implement. On CPU use {CPU_OPTIMIZER_HINT}, or run on CUDA."
            )


def resolve_node_group_size(
    node_group_size: int | None, sharding_group_size: int, num_groups: int, replica_layout: str
) -> int:
    """Ranks of one sharding group that share a host (TWRW/grid need it to divide ``L``).

    Default: from ``LOCAL_WORLD_SIZE`` — a host holds ``local // G`` ranks of a group in
    the strided intra-host layout and ``local`` in the contiguous layout — else ``L``.
    ``0`` means "not set", as in TorchRec (its TWRW sharding falls back to the local size
    when ``env.node_group_size`` is falsy).
    """
    settings = {
        "node_group_size": node_group_size,
        "sharding_group_size": sharding_group_size,
        "world_size": sharding_group_size * num_groups,
    }
    check(settings, LIBRARY_NAMES)
    if node_group_size is not None and node_group_size != 0:
        return node_group_size
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "0"))
    per_host = local // num_groups if replica_layout == "intra_host" else local
    if per_host >= 1 and sharding_group_size % per_host == 0:
        return per_host
    return sharding_group_size
