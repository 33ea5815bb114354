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
from sparse2d.train.config_ft import FaultToleranceConfig, refusals
from sparse2d.train.config_io import (
    KeyValueError,
    apply_override,
    bad,
    build,
    field_docs,
    positive,
)
from sparse2d.train.config_io import reference as _reference
from sparse2d.train.config_model import SHARDING_TYPES, ModelConfig, TableConfig, TableSpec

__all__ = [
    "SHARDING_TYPES",
    "Config",
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
class SyntheticConfig:
    """Planted-signal synthetic CTR data (a deterministic function of seed and sample index)."""

    zipf_exponent: float = 1.1
    """Exponent of the Zipf-like id frequencies (real CTR ids: about 1.0-1.2)."""
    ids_per_feature: int = 1
    """Most ids in one feature's bag; bag lengths are uniform in 1..this."""
    signal_rows: int = 32
    """Hottest rows per table that carry a planted effect on the logit; the rest carry none."""
    sparse_weight: float = 0.6
    """Standard deviation of the planted per-row effects."""
    dense_signal: int = 4
    """Dense features with a planted linear effect (the first N)."""
    dense_weight: float = 0.5
    """Standard deviation of the planted dense coefficients."""
    bias: float = -1.0
    """Planted logit bias (sets the click rate; -1.0 gives about 30%)."""

    def __post_init__(self) -> None:
        positive(self, "zipf_exponent", "ids_per_feature", "signal_rows")
        positive(self, "sparse_weight", "dense_weight", "dense_signal", allow_zero=True)


@dataclass(kw_only=True, slots=True)
class CriteoConfig:
    """Criteo 1TB / Kaggle TSV files: label, 13 integer and 26 hex categorical columns."""

    train_files: list[str] = field(default_factory=list)
    """TSV files read in order (or torchrec ``*_dense.npy`` files with ``_sparse``/``_labels`` beside)."""
    eval_files: list[str] = field(default_factory=list)
    """Held-out TSV (or ``*_dense.npy``) files for evaluation."""
    cache_dir: str | None = None
    """Where TSV files are converted to npy once (TorchRec's ``tsv_to_npys``); default ``RUN_DIR/criteo_cache``."""


@dataclass(kw_only=True, slots=True)
class DataConfig:
    """Where batches come from and how the global batch is split."""

    source: Literal["synthetic", "criteo"] = "synthetic"
    """``synthetic`` (planted signal) or ``criteo`` (TSV files)."""
    batch_size_per_rank: int = 256
    """Samples per rank per step; the global batch is ``world_size`` times this."""
    seed: int = 0
    """Seed of the synthetic data (the same data for any world or group size)."""
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    """Synthetic data options."""
    criteo: CriteoConfig = field(default_factory=CriteoConfig)
    """Criteo data options."""

    def __post_init__(self) -> None:
        positive(self, "batch_size_per_rank")
        if self.source == "criteo" and not self.criteo.train_files:
            raise bad("criteo.train_files", [], "is empty; data.source=criteo needs TSV files")
        if self.source == "criteo" and not self.criteo.eval_files:
            raise bad("criteo.eval_files", [], "is empty; data.source=criteo needs held-out files")


@dataclass(kw_only=True, slots=True)
class SyncConfig:
    """Replica sync; maps 1:1 onto ``sparse2d.sync.options.SyncOptions`` (same names and meaning)."""

    every: int = 1
    """Average replicas every N optimizer steps (local SGD in between); 1 = exact 1D semantics."""
    include_optimizer_state: bool = True
    """Average fused optimizer state (accumulators, momenta) along with the weights."""
    delayed_optimizer_state: bool = False
    """Average optimizer state one sync behind the weights (overlapped with the next interval)."""
    momentum_scaling: bool = False
    """Scale the averaged AdaGrad accumulator growth by the number of replica groups (1D-like growth)."""
    overlap: bool = False
    """Overlap the sync all-reduce with the next interval, with delta correction (not bit-exact)."""
    hide: bool = True
    """Run each sync's all-reduce in the background and land it just before the next embedding
    lookup (behind the dense optimizer step and the next batch); exact, same values as blocking."""
    compression: Literal["none", "bf16"] = "none"
    """``none`` (fp32 average) or ``bf16`` (bf16 deltas since the last sync, fp32 master values)."""
    engine: Literal["dense", "sparse", "auto"] = "auto"
    """Values a sync covers: ``dense`` (every row), ``sparse`` (only rows some replica looked up
    since the last sync), ``auto`` (per sync the cheaper of the two by a cost model measured over
    the replica group at start-up and refined from timed syncs; dense with bf16)."""
    divergence_every: int = 0
    """Measure replica divergence before every k-th sync (0 = off)."""
    divergence_rows: int = 32
    """Rows sampled per local shard for the divergence metric."""
    check_finite: bool = True
    """Refuse to average NaN/inf: every rank stops with ``SyncError`` naming the table and rank."""

    def __post_init__(self) -> None:
        positive(self, "every", "divergence_rows")
        positive(self, "divergence_every", allow_zero=True)
        try:
            self.options()
        except ConfigError as error:
            raise KeyValueError("", f": {error}") from None

    def options(self) -> Any:
        """The ``SyncOptions`` these settings describe."""
        from sparse2d.sync.options import SyncOptions

        return SyncOptions(**dataclasses.asdict(self))


@dataclass(kw_only=True, slots=True)
class ParallelConfig:
    """The 2D layout: sharding groups of ``L`` ranks, replicated ``world / L`` times."""

    sharding_group_size: int | Literal["auto"] | None = None
    """Ranks per sharding group ``L``; must divide the world size. null: the whole world (1D);
    ``auto``: the group-size advisor's pick at start-up (``sparse2d plan`` shows why)."""
    replica_layout: Literal["intra_host", "inter_host"] = "intra_host"
    """``intra_host``: replicas of a shard on adjacent ranks; ``inter_host``: contiguous groups."""
    node_group_size: int | None = None
    """Ranks of one group sharing a host (table-row-wise/grid); null: from ``LOCAL_WORLD_SIZE``."""
    sync: SyncConfig = field(default_factory=SyncConfig)
    """Replica sync cadence and options (``parallel.sync.every`` is the sync interval)."""
    sharding_strategy: Literal["default", "fully_sharded"] = "default"
    """``default``: each replica holds its group's embedding shards; ``fully_sharded``: between
    steps each replica holds 1/G of them and every step averages weights and optimizer state
    by reduce-scatter (exact; ``parallel.sync`` must stay at every=1 without overlap,
    compression, delay or scaling; its engine and divergence metric are ignored)."""
    timeout_s: float = 300.0
    """Process-group timeout: a rank stuck this long in a collective fails instead of hanging."""

    def __post_init__(self) -> None:
        if self.sharding_group_size not in (None, "auto"):
            positive(self, "sharding_group_size")
        if self.node_group_size is not None:
            positive(self, "node_group_size")
        positive(self, "timeout_s")
        if self.sharding_strategy == "fully_sharded":
            default = SyncConfig()
            changed = [
                f"sync.{k}={v!r}"
                for k, v in dataclasses.asdict(self.sync).items()
                if k not in ("engine", "divergence_every", "divergence_rows")
                and v != getattr(default, k)
            ] + (["sync.engine='sparse'"] if self.sync.engine == "sparse" else [])
            if changed:
                raise bad(
                    "sharding_strategy",
                    self.sharding_strategy,
                    f"averages every step by a dense reduce-scatter; {', '.join(changed)} "
                    "does not apply: drop it or use sharding_strategy=default",
                )

    def strategy(self) -> Any:
        """TorchRec's ``ShardingStrategy`` for ``sharding_strategy``."""
        from torchrec.distributed.types import ShardingStrategy

        return ShardingStrategy[self.sharding_strategy.upper()]


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
    """Save every N steps (0: never)."""
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
        if self.model.managed_collision.enabled and every:
            raise bad(
                "checkpoint.every",
                every,
                "must be 0 with model.managed_collision.enabled: sparse2d checkpoints do not "
                "carry managed-collision identity tables yet",
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
