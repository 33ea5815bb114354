"""Small models, deterministic batches and training loops shared by the distributed checks."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.optim import _apply_optimizer_in_backward as apply_optimizer_in_backward
from torchrec import EmbeddingBagCollection, EmbeddingCollection, KeyedJaggedTensor
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.types import ShardingEnv
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
from torchrec.optim.optimizers import in_backward_optimizer_filter

from sparse2d.core.collection import DMPCollection
from sparse2d.planner.group_plan import remap_plan
from sparse2d.planner.sharders import default_sharders
from sparse2d.sync.options import SyncOptions
from sparse2d.sync.shards import collect_shard_states

DENSE_IN = 4

DEVICE = os.environ.get("SPARSE2D_TEST_DEVICE", "cpu")
"""Where the 2D-vs-1D checks put models and batches: ``cpu`` (CI, the default) or ``cuda``
(a GPU machine: every rank on ``cuda:rank % GPUs``, gloo moving CUDA tensors, so one GPU
runs the 4-rank world; docs/benchmarks.md, CUDA). Set before pytest starts the ranks."""


def rank_device() -> torch.device:
    """This rank's device for ``DEVICE`` (call inside a rank: it reads the rank)."""
    if DEVICE == "cpu":
        return torch.device("cpu")
    rank = dist.get_rank() if dist.is_initialized() else 0
    return torch.device("cuda", rank % torch.cuda.device_count())


def on_rank_device(kjt: KeyedJaggedTensor, *tensors: torch.Tensor) -> tuple:
    """A batch moved to ``rank_device()`` (unchanged on the CPU)."""
    if DEVICE == "cpu":
        return (kjt, *tensors)
    device = rank_device()
    return (kjt.to(device), *(t.to(device) for t in tensors))


@dataclass(frozen=True)
class Table:
    name: str
    rows: int
    dim: int
    sharding: str


MIXED_TABLES = (
    Table("t0", 40, 8, "table_wise"),
    Table("t1", 48, 16, "column_wise"),
    Table("t2", 64, 8, "row_wise"),
    Table("t3", 32, 16, "table_wise"),
)

SEQUENCE_TABLES = (  # EmbeddingCollection needs one embedding dim for all tables
    Table("s0", 40, 8, "table_wise"),
    Table("s1", 48, 8, "column_wise"),
    Table("s2", 64, 8, "row_wise"),
    Table("s3", 32, 8, "table_wise"),
)


class PooledModel(nn.Module):
    """EBC + a dense layer on the pooled embeddings and dense features."""

    def __init__(self, tables: tuple[Table, ...], device: str = "cpu") -> None:
        super().__init__()
        self.names = [t.name for t in tables]
        self.ebc = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(
                    name=t.name,
                    embedding_dim=t.dim,
                    num_embeddings=t.rows,
                    feature_names=[f"f_{t.name}"],
                )
                for t in tables
            ],
            device=torch.device(device),
        )
        self.dense = nn.Linear(sum(t.dim for t in tables) + DENSE_IN, 1, device=device)

    def forward(self, kjt: KeyedJaggedTensor, dense: torch.Tensor) -> torch.Tensor:
        pooled = self.ebc(kjt).to_dict()
        features = [pooled[f"f_{n}"] for n in self.names]
        return self.dense(torch.cat([*features, dense], dim=1)).squeeze(1)


class SequenceModel(nn.Module):
    """EC (sequence embeddings) summed per sample, then a dense layer."""

    def __init__(self, tables: tuple[Table, ...], device: str = "cpu") -> None:
        super().__init__()
        self.names = [t.name for t in tables]
        self.dims = [t.dim for t in tables]
        self.ec = EmbeddingCollection(
            tables=[
                EmbeddingConfig(
                    name=t.name,
                    embedding_dim=t.dim,
                    num_embeddings=t.rows,
                    feature_names=[f"f_{t.name}"],
                )
                for t in tables
            ],
            device=torch.device(device),
        )
        self.dense = nn.Linear(sum(self.dims) + DENSE_IN, 1, device=device)

    def forward(self, kjt: KeyedJaggedTensor, dense: torch.Tensor) -> torch.Tensor:
        jagged = self.ec(kjt)
        batch = dense.shape[0]
        features = []
        for name, dim in zip(self.names, self.dims, strict=True):
            jt = jagged[f"f_{name}"]
            owner = torch.repeat_interleave(torch.arange(batch, device=dense.device), jt.lengths())
            summed = torch.zeros(batch, dim, device=dense.device)
            features.append(summed.index_add(0, owner, jt.values()))
        return self.dense(torch.cat([*features, dense], dim=1)).squeeze(1)


def make_batch(
    tables: tuple[Table, ...], step: int, rank: int, batch: int = 8, seed: int = 0
) -> tuple[KeyedJaggedTensor, torch.Tensor, torch.Tensor]:
    """A deterministic batch for (seed, step, rank): the same on any sharding layout."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    lengths, values = [], []
    for t in tables:
        length = torch.randint(0, 4, (batch,), generator=gen)
        lengths.append(length)
        values.append(torch.randint(0, t.rows, (int(length.sum()),), generator=gen))
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f_{t.name}" for t in tables],
        values=torch.cat(values),
        lengths=torch.cat(lengths),
    )
    dense = torch.randn(batch, DENSE_IN, generator=gen)
    target = torch.randn(batch, generator=gen)
    return on_rank_device(kjt, dense, target)


def build_model(
    tables: tuple[Table, ...],
    kind: str = "pooled",
    optimizer: type = torch.optim.SGD,
    lr: float = 0.1,
    seed: int = 0,
    device: str | None = None,
    **opt_kwargs: float,
) -> nn.Module:
    """The unsharded model on ``device`` (e.g. ``meta``), by default ``rank_device()``: built
    on the CPU from the seed, then moved, so a GPU run starts from the CPU run's weights.
    Its tables' fused optimizer is set."""
    torch.manual_seed(seed)
    model = (PooledModel if kind == "pooled" else SequenceModel)(tables, device or "cpu")
    if device is None and DEVICE != "cpu":
        model = model.to(rank_device())
    module = model.ebc if kind == "pooled" else model.ec
    apply_optimizer_in_backward(optimizer, module.parameters(), {"lr": lr, **opt_kwargs})
    return model


def constraints_for(tables: tuple[Table, ...]) -> dict[str, ParameterConstraints]:
    return {
        t.name: ParameterConstraints(sharding_types=[t.sharding], min_partition=4) for t in tables
    }


def full_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded model's tables, used to seed sharded models identically."""
    module = model.ebc if hasattr(model, "ebc") else model.ec
    bags = module.embedding_bags if hasattr(module, "embedding_bags") else module.embeddings
    return {name: bag.weight.detach().clone() for name, bag in bags.items()}


def load_full_weights(sharded: nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Copy unsharded tables into the local shards of a sharded model."""
    with torch.no_grad():
        for shard in collect_shard_states(sharded):
            full = weights[shard.table]
            shard.weight.copy_(
                full[
                    shard.row_offset : shard.row_offset + shard.rows,
                    shard.col_offset : shard.col_offset + shard.cols,
                ]
            )


def gather_tables(
    sharded: nn.Module, tables: tuple[Table, ...], pg: dist.ProcessGroup | None
) -> dict[str, torch.Tensor]:
    """Reassemble full tables (and row-wise state sums) from the shards held in ``pg``."""
    device = rank_device()
    out = {t.name: torch.zeros(t.rows, t.dim, device=device) for t in tables}
    for shard in collect_shard_states(sharded):
        out[shard.table][
            shard.row_offset : shard.row_offset + shard.rows,
            shard.col_offset : shard.col_offset + shard.cols,
        ] = shard.weight.detach()
    for name in sorted(out):
        dist.all_reduce(out[name], group=pg)
    return out


def dense_params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {
        name.replace("module.", "").replace("_dmp_wrapped_module.", ""): p.detach().clone()
        for name, p in in_backward_optimizer_filter(model.named_parameters())
    }


def shard_1d(model: nn.Module, tables: tuple[Table, ...]) -> DistributedModelParallel:
    """TorchRec's own 1D DMP over the whole world: the reference."""
    world, device = dist.get_world_size(), rank_device()
    plan = EmbeddingShardingPlanner(
        topology=Topology(world_size=world, compute_device=device.type, local_world_size=world),
        constraints=constraints_for(tables),
    ).collective_plan(model, default_sharders())
    if device.type == "cuda":  # TorchRec places rank r on cuda:r; here ranks share the GPUs
        plan = remap_plan(plan, list(range(world)), device)
    return DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(dist.group.WORLD),
        device=device,
        plan=plan,
        sharders=default_sharders(),
    )


def train(
    model: nn.Module,
    tables: tuple[Table, ...],
    steps: int,
    after_step: Callable[[int], None] | None = None,
    lr: float = 0.1,
    seed: int = 0,
    on_loss: Callable[[torch.Tensor], None] | None = None,
) -> list[float]:
    """Train with MSE on deterministic batches; ``after_step(step)`` runs after each step,
    ``on_loss(loss)`` before each backward (e.g. to register a hook that runs in it)."""
    dense_opt = torch.optim.SGD(
        [p for _, p in in_backward_optimizer_filter(model.named_parameters())], lr=lr
    )
    losses = []
    for step in range(steps):
        kjt, dense, target = make_batch(tables, step, dist.get_rank(), seed=seed)
        loss = ((model(kjt, dense) - target) ** 2).mean()
        if on_loss is not None:
            on_loss(loss)
        loss.backward()
        dense_opt.step()
        dense_opt.zero_grad()
        losses.append(float(loss.detach()))
        if after_step is not None:
            after_step(step)
    return losses


def replica_max_diff(
    sharded: nn.Module, replica_pg: dist.ProcessGroup, shards: list | None = None
) -> float:
    """Largest |difference| between this rank's shards (weights and optimizer state; all of
    ``sharded``'s unless ``shards`` names them) and replica-rank 0's copy; 0.0 means
    bit-identical replicas."""
    worst = torch.zeros(())
    for shard in collect_shard_states(sharded) if shards is None else shards:
        for tensor in [shard.weight, *shard.optimizer_states]:
            reference = tensor.detach().clone()
            dist.broadcast(reference, src=dist.get_global_rank(replica_pg, 0), group=replica_pg)
            worst = torch.maximum(worst, (tensor.detach() - reference).abs().max())
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return float(worst)


SPARSE_SYNC_TABLES = (
    *MIXED_TABLES,
    Table("t4", 56, 8, "table_row_wise"),
    Table("t5", 4096, 4, "row_wise"),
)
"""Every sharding type (TW/CW/RW/TWRW) plus a large row-wise table that few ids touch."""


def adagrad_2d(group_size: int = 2, **sync_options: object) -> DMPCollection:
    """``MIXED_TABLES`` with row-wise AdaGrad (weights and accumulators to sync), sharded
    in groups of ``group_size`` with ``SyncOptions(**sync_options)``, blocking syncs unless
    they say ``hide`` (the callers read replicas right after a sync; a hidden one lands only
    before the next lookup)."""
    from torchrec.optim import RowWiseAdagrad

    return DMPCollection(
        build_model(MIXED_TABLES, optimizer=RowWiseAdagrad, lr=0.05),
        group_size,
        device=rank_device(),
        constraints=constraints_for(MIXED_TABLES),
        node_group_size=2,
        sync_options=SyncOptions(**{"hide": False, **sync_options}),  # type: ignore[arg-type]
    )
