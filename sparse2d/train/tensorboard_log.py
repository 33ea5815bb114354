"""TensorBoard event files from the trainer's records (``metrics.tensorboard``, rank 0).

Each number of a logged record becomes a scalar ``KIND/KEY`` (nested dicts ``KIND/KEY/SUB``;
``train_loss`` in a ``train`` record is ``train/loss``), so a new record kind shows up with no
code here. Strings are left out; the ``start`` record becomes one text entry.
"""

from __future__ import annotations

import math
import os
from typing import Any

SUBDIR = "tensorboard"


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """``{tag: value}`` for every finite number in ``record`` (see the module docstring)."""
    kind = str(record.get("kind", "run"))
    out: dict[str, float] = {}

    def visit(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, sub in value.items():
                visit(f"{prefix}/{key}", sub)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            if math.isfinite(value):
                out[prefix] = float(value)

    for key, value in record.items():
        if key in ("kind", "step"):
            continue
        name = key[len(kind) + 1 :] if key.startswith(f"{kind}_") else key
        visit(f"{kind}/{name}", value)
    return out


class TensorBoardLog:
    """A ``SummaryWriter`` over ``RUN_DIR/tensorboard``; flushed after every record, so the
    files are complete however the process ends (the trainer exits with ``os._exit``)."""

    def __init__(self, run_dir: str) -> None:
        from torch.utils.tensorboard import SummaryWriter  # the trainer's optional dependency

        self.path = os.path.join(run_dir, SUBDIR)
        self.writer = SummaryWriter(log_dir=self.path)

    def write(self, record: dict[str, Any], step: int) -> None:
        """Log ``record``'s numbers at ``record["step"]`` (``step`` when it has none)."""
        at = int(record.get("step", step))
        if record.get("kind") == "start":
            rows = "\n".join(f"| {k} | {v} |" for k, v in _flat(record).items() if k != "kind")
            self.writer.add_text("run/start", f"| key | value |\n|---|---|\n{rows}", at)
        else:
            for tag, value in scalars(record).items():
                self.writer.add_scalar(tag, value, at)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _flat(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
