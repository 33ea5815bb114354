"""The whole trainer config (``Config``): its sections, the checks across sections, and the
checks that need the world size or the file system (``check_runtime``)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Literal

from sparse2d.errors import ConfigError, KeyValueError
from sparse2d.mesh import divisors
from sparse2d.option_conflicts import first_conflict, sync_settings
from sparse2d.train.config.checkpoint import CheckpointConfig
from sparse2d.train.config.criteo_schema import check_features, missing_files, unreadable
from sparse2d.train.config.data import DataConfig
from sparse2d.train.config.fault_tolerance import FaultToleranceConfig, disabled
from sparse2d.train.config.model import ModelConfig
from sparse2d.train.config.optimizer import OptimizerConfig
from sparse2d.train.config.parallel import ParallelConfig
from sparse2d.train.config.paths import check_new_run, check_writable
from sparse2d.train.config.train import MetricsConfig, TrainConfig

TRAINER_KEYS = {
    "sync.": "parallel.sync.",
    "sharding_strategy": "parallel.sharding_strategy",
    "sharding_group_size": "parallel.sharding_group_size",
    "node_group_size": "parallel.node_group_size",
    "replica_layout": "parallel.replica_layout",
    "fault_tolerance": "fault_tolerance.enable",
    "managed_collision": "model.managed_collision.kind",
    "mch.eviction_interval": "model.managed_collision.eviction_interval",
    "pipeline": "train.pipeline",
}
"""The dotted keys of ``sparse2d.option_conflicts``' settings (the rest are spelled alike)."""


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
    fault_tolerance: FaultToleranceConfig = field(default_factory=disabled)
    """Fault-tolerant 2D on torchft (one torchrun world per sharding group; docs/fault_tolerance.md)."""
    run_dir: str = "runs/default"
    """Output directory: ``summary.json``, ``metrics.jsonl``, ``config.yaml``, checkpoints."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """``auto``: CUDA + nccl when a GPU is visible, else CPU + gloo."""

    def __post_init__(self) -> None:
        if self.data.source == "criteo":
            check_features(self.model.feature_names, self.model.dense_in_features)
        self.check_conflicts()

    def check_conflicts(self, world_size: int | None = None) -> None:
        """Refuse a combination of options (``sparse2d.option_conflicts``' rules, named by
        their dotted keys); with ``world_size``, the rules that need it too."""
        p, mc = self.parallel, self.model.managed_collision
        settings = sync_settings(p.sync) | {
            "sharding_strategy": p.sharding_strategy,
            "sharding_group_size": p.sharding_group_size,
            "node_group_size": p.node_group_size,
            "replica_layout": p.replica_layout,
            "fault_tolerance": self.fault_tolerance.enable,
            "managed_collision": mc.kind if mc.enabled else None,
            "mch.eviction_interval": mc.eviction_interval,
            "pipeline": self.train.pipeline,
            "checkpoint.every": self.checkpoint.every,
        }
        if world_size is not None:
            settings["world_size"] = world_size
        conflict = first_conflict(settings, TRAINER_KEYS)
        if conflict is not None:
            raise KeyValueError(conflict.key, conflict.detail)

    # ---- derived ------------------------------------------------------------------
    @property
    def checkpoint_dir(self) -> str:
        return self.checkpoint.dir or os.path.join(self.run_dir, "checkpoints")

    def group_size(self, world_size: int) -> int | str:
        """``L`` for ``world_size`` ranks, or ``"auto"`` (resolved by the advisor at start-up)."""
        return self.parallel.sharding_group_size or world_size

    # ---- when the loop logs, evaluates and saves (one place: the loop and the
    # fault-tolerant mode's late votes, sparse2d.train.ft_mode, both read these) -------
    def logs_after(self, done: int) -> bool:
        """The loop logs a ``train`` record after ``done`` steps (``train.log_every``, and the
        last step)."""
        return done % self.train.log_every == 0 or done == self.train.steps

    def evaluates_after(self, done: int) -> bool:
        """The loop evaluates after ``done`` steps (``train.eval_every``; the final evaluation
        follows the loop)."""
        every = self.train.eval_every
        return bool(every) and done % every == 0 and done != self.train.steps

    def saves_after(self, done: int) -> bool:
        """The loop saves a checkpoint after ``done`` steps: on ``checkpoint.every`` and at the
        end."""
        every = self.checkpoint.every
        return every > 0 and (done % every == 0 or done == self.train.steps)

    def reads_state_after(self, done: int) -> bool:
        """The loop reads the model's state after ``done`` steps: it evaluates or saves, or
        the job ends (a mode whose commits land late lands them first)."""
        return done >= self.train.steps or self.evaluates_after(done) or self.saves_after(done)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def check_runtime(
        self,
        world_size: int,
        local_world_size: int | None = None,
        check_paths: bool = True,
        new_run: bool = True,
    ) -> None:
        """Checks that need the world size or the file system; pure, so every rank agrees.
        ``new_run``: this is a run that will write ``run_dir`` (not a dry run)."""
        local = local_world_size or world_size
        nodes = max(1, world_size // local)
        factors = f"world_size={world_size} ({nodes} node(s) x {local} process(es) per node)"
        size = self.parallel.sharding_group_size
        if size != "auto":  # "auto" is resolved at start-up and always divides the world
            self._check_group(size, world_size, factors)
        self.check_conflicts(world_size)
        if self.metrics.tensorboard and not tensorboard_installed():
            raise ConfigError(
                "metrics.tensorboard=true needs the tensorboard package, which is not installed: "
                "pip install 'sparse2d[train]' (or tensorboard), or set metrics.tensorboard=false."
            )
        if check_paths:
            check_writable(self)
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
        if check_paths and new_run:
            check_new_run(self)

    def one_replica_note(self, world_size: int) -> str | None:
        """A line for a run whose set ``parallel.sharding_group_size`` equals the world: one
        replica of every shard, so 1D, not 2D (a config written for more processes, e.g.
        ``dlrm_criteo_1host_8gpu`` launched with 4); None otherwise."""
        size = self.parallel.sharding_group_size
        if size != world_size or world_size < 2 or self.fault_tolerance.enable:
            return None
        smaller = [d for d in divisors(world_size) if d < world_size]
        return (
            f"parallel.sharding_group_size={size} equals the world size {world_size}: one "
            "replica of every shard, so this run is 1D (no replica sync); for 2D set "
            f"parallel.sharding_group_size={smaller[-1]} (a divisor below {world_size}) or "
            f"launch {2 * size} processes"
        )

    def _check_group(self, size: int | None, world_size: int, factors: str) -> None:
        if size is not None and (size > world_size or world_size % size):
            raise ConfigError(
                f"parallel.sharding_group_size={size} does not divide {factors}: "
                f"{world_size} % {size} = {world_size % size}; choose one of "
                f"{divisors(world_size)}."
            )


def tensorboard_installed() -> bool:
    """Whether ``torch.utils.tensorboard`` can write (the trainer's optional dependency)."""
    try:  # a probe of the optional dependency: imported only to see that it is there
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True
