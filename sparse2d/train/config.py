"""Trainer configuration: nested dataclasses loaded from YAML, with dotted CLI overrides.

Every field carries a docstring (the string literal under it); ``python -m sparse2d.train.config
--reference`` turns them into ``docs/CONFIG.md``. Loading is strict: unknown keys are
rejected with the list of valid ones, types are checked, and every error is one line
naming the dotted key, e.g. ``optimizer.sparse.lr=-0.1 must be > 0``. Checks that need
the world size run in ``check_runtime`` at trainer start, identically on every rank and
before any collective.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from sparse2d.errors import ConfigError
from sparse2d.mesh import divisors
from sparse2d.train.config_criteo import check_features, missing_files, unreadable
from sparse2d.train.config_data import CriteoConfig, DataConfig, SyntheticConfig
from sparse2d.train.config_ft import FaultToleranceConfig, refusals
from sparse2d.train.config_io import (
    apply_override,
    bad,
    build,
    field_docs,
    positive,
)
from sparse2d.train.config_io import reference as _reference
from sparse2d.train.config_model import SHARDING_TYPES, ModelConfig, TableConfig, TableSpec
from sparse2d.train.config_parallel import ParallelConfig, SyncConfig

__all__ = [
    "SHARDING_TYPES",
    "Config",
    "CriteoConfig",
    "DataConfig",
    "ParallelConfig",
    "SyncConfig",
    "SyntheticConfig",
    "ModelConfig",
    "TableConfig",
    "TableSpec",
    "ConfigError",
    "apply_override",
    "bad",
    "dump_yaml",
    "field_docs",
    "load_config",
    "reference",
]


@dataclass(kw_only=True, slots=True)
class SparseOptimizerConfig:
    """The fused embedding optimizer (applied in backward by FBGEMM)."""

    kind: Literal["sgd", "adagrad", "rowwise_adagrad"] = "rowwise_adagrad"
    """``sgd`` (EXACT_SGD), ``adagrad`` (EXACT_ADAGRAD) or ``rowwise_adagrad`` (EXACT_ROWWISE_ADAGRAD)."""
    lr: float = 0.05
    """Learning rate."""
    eps: float = 1e-8
    """Adagrad epsilon (ignored by sgd)."""

    def __post_init__(self) -> None:
        positive(self, "lr", "eps")


@dataclass(kw_only=True, slots=True)
class DenseOptimizerConfig:
    """The optimizer of the dense (data-parallel) parameters."""

    kind: Literal["sgd", "adagrad", "adam"] = "adagrad"
    """``sgd``, ``adagrad`` or ``adam`` (torch.optim)."""
    lr: float = 0.05
    """Learning rate."""
    eps: float = 1e-8
    """Epsilon of adagrad/adam (ignored by sgd)."""

    def __post_init__(self) -> None:
        positive(self, "lr", "eps")


@dataclass(kw_only=True, slots=True)
class OptimizerConfig:
    """Sparse (embedding) and dense optimizers."""

    sparse: SparseOptimizerConfig = field(default_factory=SparseOptimizerConfig)
    """Embedding optimizer."""
    dense: DenseOptimizerConfig = field(default_factory=DenseOptimizerConfig)
    """Dense optimizer."""


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    """Loop length, evaluation and logging."""

    steps: int = 1000
    """Optimizer steps."""
    eval_every: int = 0
    """Evaluate every N steps (0: only at the end; the final evaluation always runs)."""
    eval_batches: int = 20
    """Evaluation batches per rank (a fixed held-out set of ``eval_batches`` global batches)."""
    log_every: int = 50
    """Log train loss/AUC/NE, samples/s and sync time every N steps."""
    resume: Literal["none", "auto"] = "none"
    """``auto``: continue from the latest checkpoint in ``checkpoint.dir`` when there is one."""
    progress_bar: bool = True
    """Show a tqdm progress bar (rank 0 only, and only when stderr is a terminal: logs get lines)."""
    pipeline: Literal["sparse_dist", "semi_sync", "none"] = "none"
    """TorchRec train pipeline driving the steps: ``sparse_dist`` (``TrainPipelineSparseDist``:
    the next batches' input all-to-all overlaps this step), ``semi_sync``
    (``TrainPipelineSemiSync``: the next batch's embedding lookup too, on weights one step
    older), ``none`` (plain forward, backward, step; measured fastest on CPU, bench/RESULTS.md).
    Replicas sync on the ``parallel.sync`` cadence either way."""

    def __post_init__(self) -> None:
        positive(self, "steps", "eval_batches", "log_every")
        positive(self, "eval_every", allow_zero=True)


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    """Periodic checkpoints."""

    dir: str | None = None
    """Checkpoint directory; default ``RUN_DIR/checkpoints``."""
    every: int = 0
    """Save every N steps (0: never); a multiple of ``parallel.sync.every`` and, with MCH
    managed-collision tables, of ``model.managed_collision.eviction_interval``."""
    keep: int = 2
    """Keep the newest K checkpoints."""

    def __post_init__(self) -> None:
        positive(self, "every", allow_zero=True)
        positive(self, "keep")


@dataclass(kw_only=True, slots=True)
class MetricsConfig:
    """What a run records besides ``metrics.jsonl`` and ``summary.json`` (rank 0 only)."""

    tensorboard: bool = True
    """Write TensorBoard event files to ``RUN_DIR/tensorboard/``: every logged number (train
    and eval loss, AUC, NE, samples/s, sync seconds, bytes and modes, replica divergence, ...)
    as a scalar at its step. Needs the ``tensorboard`` package (``pip install
    'sparse2d[train]'``; ``make train`` installs it). View: ``tensorboard --logdir runs``."""


@dataclass(kw_only=True, slots=True)
class Config:
    """A training run."""

    model: ModelConfig
    """The model (required: at least ``model.tables``)."""
    data: DataConfig = field(default_factory=DataConfig)
    """The data."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """The 2D layout and replica sync."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """Optimizers."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The training loop."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpoints."""
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    """Run records (TensorBoard)."""
    fault_tolerance: FaultToleranceConfig = field(default_factory=FaultToleranceConfig)
    """Fault-tolerant 2D on torchft (one torchrun world per sharding group; docs/fault_tolerance.md)."""
    run_dir: str = "runs/default"
    """Output directory: ``summary.json``, ``metrics.jsonl``, ``config.yaml``, checkpoints."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """``auto``: CUDA + nccl when a GPU is visible, else CPU + gloo."""

    def __post_init__(self) -> None:
        every, sync = self.checkpoint.every, self.parallel.sync.every
        if every and every % sync:
            raise bad(
                "checkpoint.every",
                every,
                f"must be a multiple of parallel.sync.every={sync} (save right after a sync, "
                "when the replicas agree)",
            )
        if self.data.source == "criteo":
            check_features(self.model.feature_names, self.model.dense_in_features)
        mc = self.model.managed_collision
        if mc.enabled and mc.kind == "mch" and every % mc.eviction_interval:
            raise bad(
                "checkpoint.every",
                every,
                f"must be a multiple of model.managed_collision.eviction_interval="
                f"{mc.eviction_interval} (ids seen since the last eviction round are not in "
                "checkpoints, as in TorchRec's own state dict)",
            )
        mc = self.model.managed_collision
        if mc.enabled:
            from sparse2d.sync.mc.rules import refusals as mc_refusals

            refused = mc_refusals(
                momentum_scaling=self.parallel.sync.momentum_scaling,
                fully_sharded=self.parallel.sharding_strategy == "fully_sharded",
                pipeline=self.train.pipeline,
            )
            if refused:
                raise ConfigError(
                    f"model.managed_collision.enabled=true (kind={mc.kind}) cannot run with "
                    + "; ".join(refused)
                    + ": drop the option or the managed-collision tables"
                )
        refused = refusals(self)
        if refused:
            raise ConfigError(
                "fault_tolerance.enable=true cannot run with " + "; ".join(refused) + ": drop "
                "the option or disable fault tolerance"
            )

    # ---- derived ------------------------------------------------------------------
    @property
    def checkpoint_dir(self) -> str:
        return self.checkpoint.dir or os.path.join(self.run_dir, "checkpoints")

    def group_size(self, world_size: int) -> int | str:
        """``L`` for ``world_size`` ranks, or ``"auto"`` (resolved by the advisor at start-up)."""
        return self.parallel.sharding_group_size or world_size

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def check_runtime(
        self, world_size: int, local_world_size: int | None = None, check_paths: bool = True
    ) -> None:
        """Checks that need the world size or the file system; pure, so every rank agrees."""
        local = local_world_size or world_size
        nodes = max(1, world_size // local)
        factors = f"world_size={world_size} ({nodes} node(s) x {local} process(es) per node)"
        size = self.parallel.sharding_group_size
        if self.fault_tolerance.enable and size not in (None, world_size):
            raise ConfigError(
                f"parallel.sharding_group_size={size} with fault_tolerance.enable: each torchrun "
                f"world ({factors}) is one sharding group; leave it null (or {world_size}) and "
                "set fault_tolerance.group_size to the number of groups"
            )
        if size != "auto":  # "auto" is resolved at start-up and always divides the world
            self._check_group(size, world_size, factors)
        if self.metrics.tensorboard and not tensorboard_installed():
            raise ConfigError(
                "metrics.tensorboard=true needs the tensorboard package, which is not installed: "
                "pip install 'sparse2d[train]' (or tensorboard), or set metrics.tensorboard=false."
            )
        if check_paths and self.data.source == "criteo":
            for key in ("train_files", "eval_files"):
                for i, path in enumerate(getattr(self.data.criteo, key)):
                    missing = missing_files(path)
                    if missing:
                        raise ConfigError(
                            f"data.criteo.{key}[{i}]={path!r}: file not found: {missing[0]!r}."
                        )
                    problem = unreadable(path)
                    if problem:
                        raise ConfigError(f"data.criteo.{key}[{i}]={path!r}: {problem}.")

    def _check_group(self, size: int | None, world_size: int, factors: str) -> None:
        if size is not None and (size > world_size or world_size % size):
            raise ConfigError(
                f"parallel.sharding_group_size={size} does not divide {factors}: "
                f"{world_size} % {size} = {world_size % size}; choose one of "
                f"{divisors(world_size)}."
            )
        group = size or world_size
        ngs = self.parallel.node_group_size
        if ngs is not None and group % ngs:
            raise ConfigError(
                f"parallel.node_group_size={ngs} does not divide the sharding group size "
                f"{group} (parallel.sharding_group_size={size}, {factors})."
            )


def tensorboard_installed() -> bool:
    """Whether ``torch.utils.tensorboard`` can write (the trainer's optional dependency)."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


def load_config(path: str | None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read YAML (or start empty), apply overrides, build and validate a ``Config``."""
    data: dict[str, Any] = {}
    if path is not None:
        if not os.path.exists(path):
            raise ConfigError(f"--config {path!r}: file not found.")
        with open(path) as f:
            try:
                data = yaml.safe_load(f) or {}
            except yaml.YAMLError as error:
                raise ConfigError(f"{path}: not valid YAML: {error}".replace("\n", " ")) from None
    for override in overrides:
        apply_override(data, override)
    return build(Config, data, "")


def dump_yaml(cfg: Config) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)


def reference() -> str:
    """Markdown reference of every section and key (``docs/CONFIG.md``)."""
    return _reference(Config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparse2d.train.config", description=__doc__)
    parser.add_argument("--reference", action="store_true", help="print docs/CONFIG.md")
    parser.add_argument("--check", metavar="CONFIG", help="load and validate CONFIG")
    parser.add_argument("--print", dest="show", action="store_true", help="print resolved YAML")
    parser.add_argument("--world-size", type=int, help="also run the world-size checks")
    parser.add_argument("--local-world-size", type=int)
    parser.add_argument("--no-paths", action="store_true", help="skip data file checks")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value overrides")
    args = parser.parse_args(argv)
    if args.reference:
        sys.stdout.write(reference())
        return 0
    if not args.check:
        parser.error("give --reference or --check CONFIG")
    try:
        cfg = load_config(args.check, args.overrides)
        if args.world_size:
            cfg.check_runtime(args.world_size, args.local_world_size, not args.no_paths)
    except ConfigError as error:
        print(f"sparse2d: config error: {error}", file=sys.stderr)
        return 1
    if args.show:
        sys.stdout.write(dump_yaml(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
