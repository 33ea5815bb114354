"""What the trainer trains: TorchRec's DLRM on ``meta``, its optimizers, and its 2D sharding.

TorchRec (and what loads it: ``sparse2d.validation``, ``DMPCollection``, the managed-collision
wrapper) is imported inside the functions that use it, not at the top: ``sparse2d.train.main``
imports this module for ``resolve_device``, and a bad config must fail before TorchRec's
seconds of import.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from sparse2d.advisor.auto_pick import AutoPick, decide, topology_for_device
from sparse2d.comm_device import share_from_rank0
from sparse2d.train.advisor_workload import workload_from_config
from sparse2d.train.config import Config


def resolve_device(cfg: Config) -> torch.device:
    """The config's ``device`` (``auto``: this rank's GPU when CUDA is available, else cpu)."""
    from sparse2d.validation import resolve_device as resolve  # TorchRec (module docstring)

    return resolve(None if cfg.device == "auto" else cfg.device)


def build_model(cfg: Config, device: torch.device) -> torch.nn.Module:
    """TorchRec ``DLRMTrain(DLRM)``: tables on ``meta``, dense layers on ``device``."""
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec import EmbeddingBagCollection  # TorchRec (module docstring)
    from torchrec.models.dlrm import DLRM, DLRM_DCN, DLRMTrain
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
    from torchrec.optim import RowWiseAdagrad

    m = cfg.model
    torch.manual_seed(m.init_seed)
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name=t.name,
                embedding_dim=t.dim,
                num_embeddings=t.rows,
                feature_names=list(t.features),
                pooling=PoolingType.SUM if t.pooling == "sum" else PoolingType.MEAN,
            )
            for t in m.specs()
        ],
        device=torch.device("meta"),
    )
    tables: torch.nn.Module = ebc
    if m.managed_collision.enabled:
        from sparse2d.train.mc_embeddings import managed  # TorchRec (module docstring)

        world = dist.get_world_size() if dist.is_initialized() else 1
        mc = managed(ebc, m.managed_collision, buckets=world)
        ebc, tables = mc, mc.tables  # type: ignore[assignment]
    common = dict(
        embedding_bag_collection=ebc,
        dense_in_features=m.dense_in_features,
        dense_arch_layer_sizes=list(m.dense_arch),
        over_arch_layer_sizes=list(m.over_arch),
        dense_device=device,
    )
    if m.arch == "dlrm_dcn":
        dlrm = DLRM_DCN(
            **common, dcn_num_layers=m.dcn_num_layers, dcn_low_rank_dim=m.dcn_low_rank_dim
        )
    else:
        dlrm = DLRM(**common)
    sparse = cfg.optimizer.sparse
    cls, kwargs = {
        "sgd": (torch.optim.SGD, {"lr": sparse.lr}),
        "adagrad": (torch.optim.Adagrad, {"lr": sparse.lr, "eps": sparse.eps}),
        "rowwise_adagrad": (RowWiseAdagrad, {"lr": sparse.lr, "eps": sparse.eps}),
    }[sparse.kind]
    _apply_optimizer_in_backward(cls, tables.parameters(), kwargs)
    return DLRMTrain(dlrm)


def dense_optimizer(cfg: Config, model: torch.nn.Module) -> torch.optim.Optimizer:
    from torchrec.optim.optimizers import in_backward_optimizer_filter  # (module docstring)

    params = [p for _, p in in_backward_optimizer_filter(model.named_parameters())]
    d = cfg.optimizer.dense
    if d.kind == "sgd":
        return torch.optim.SGD(params, lr=d.lr)
    if d.kind == "adam":
        return torch.optim.Adam(params, lr=d.lr, eps=d.eps)
    return torch.optim.Adagrad(params, lr=d.lr, eps=d.eps)


def shard(cfg: Config, module: torch.nn.Module, device: torch.device, world: int) -> Any:
    """``module`` sharded at the config's ``L``; for ``auto`` the cost model's pick
    (``resolve_group_size``), kept as ``model.auto_pick`` for the loop's start-up line."""
    size, layout, pick = resolve_group_size(cfg, device, world)
    model = shard_at(cfg, module, device, size, layout)
    model.auto_pick = pick
    return model


def resolve_group_size(
    cfg: Config, device: torch.device, world: int
) -> tuple[int, str, AutoPick | None]:
    """``L`` and the replica layout for this job and, for ``auto``, the cost model's pick.
    ``replica_layout: auto`` takes the advisor's layout for the ``L`` (the faster of the two
    on the job's topology: ``SPARSE2D_TOPOLOGY`` where a launcher describes the cluster).
    Rank 0 decides and every rank receives: the same answer, or the same ``NoFitError``."""
    size, layout = cfg.group_size(world), cfg.parallel.replica_layout
    if size != "auto" and layout != "auto":
        return int(size), layout, None
    fixed = None if size == "auto" else int(size)
    pick: AutoPick = share_from_rank0(
        lambda: decide(workload_from_config(cfg), topology_for_device(device, world), fixed),
        dist.group.WORLD,
    )
    chosen = pick.replica_layout if layout == "auto" else layout
    return pick.sharding_group_size, chosen, pick if fixed is None else None


def shard_at(
    cfg: Config, module: torch.nn.Module, device: torch.device, size: int, layout: str | None = None
) -> Any:
    """``module`` as a ``DMPCollection`` with sharding groups of ``size`` ranks, replicas in
    ``layout`` (default ``parallel.replica_layout``, which must then not be ``auto``); the plan for
    ``size`` is stored under ``RUN_DIR/plans`` and reused by restarts, relaunches, replica
    groups and dry runs."""
    from sparse2d import DMPCollection  # TorchRec (module docstring)

    return DMPCollection(module, size, **shard_options(cfg, device, layout))


def shard_options(cfg: Config, device: torch.device, layout: str | None = None) -> dict[str, Any]:
    """The ``DMPCollection`` keywords of the config (``shard_at``; a dry run's plan alone),
    replicas in ``layout`` (default ``parallel.replica_layout``)."""
    from torchrec.distributed.planner.types import ParameterConstraints  # (module docstring)

    constraints = {
        t.name: ParameterConstraints(sharding_types=[t.sharding])
        for t in cfg.model.specs()
        if t.sharding is not None and not cfg.model.managed_collision.enabled  # MC: row-wise
    }
    fully_sharded = cfg.parallel.sharding_strategy == "fully_sharded"
    return dict(
        device=device,
        constraints=constraints or None,
        replica_layout=layout or cfg.parallel.replica_layout,
        node_group_size=cfg.parallel.node_group_size,
        planner_batch_size=cfg.data.batch_size_per_rank,
        sync_options=None if fully_sharded else cfg.parallel.sync,
        sharding_strategy=cfg.parallel.strategy(),
        plan_store=os.path.join(cfg.run_dir, "plans"),
    )
