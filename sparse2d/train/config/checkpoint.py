"""The ``checkpoint`` section of the trainer config: periodic checkpoints."""

from __future__ import annotations

from dataclasses import dataclass

from sparse2d.train.config.io import positive


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
