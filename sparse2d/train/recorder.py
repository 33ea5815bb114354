"""What a run leaves in its directory, for every trainer mode: ``config.yaml``,
``metrics.jsonl`` (one JSON record a line), TensorBoard event files (``metrics.tensorboard``)
and ``summary.json``, plus one printed line per record.

Only rank 0 writes (``is_main``); other ranks' calls do nothing, so the loop calls every
method on every rank. A fault-tolerant group labels its lines (``[train] replica=1 ...``)
and stamps each record with the wall ``time`` (stalls and heal timing across groups).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from tqdm import tqdm

from sparse2d.environment import one_line
from sparse2d.train.config import Config, dump_yaml


class Recorder:
    """The run directory's files (see the module docstring)."""

    def __init__(
        self,
        cfg: Config,
        run_dir: str,
        is_main: bool,
        label: str = "",
        wall_time: bool = False,
    ) -> None:
        self.run_dir, self.is_main = run_dir, is_main
        self.label, self.wall_time = label, wall_time
        self._metrics: Any = None
        self._tensorboard: Any = None
        if not is_main:
            return
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, "config.yaml"), "w") as f:
            f.write(dump_yaml(cfg))
        self._metrics = open(os.path.join(run_dir, "metrics.jsonl"), "a")  # noqa: SIM115
        if cfg.metrics.tensorboard:  # the optional dependency loads only when asked for
            from sparse2d.train.tensorboard_log import TensorBoardLog

            self._tensorboard = TensorBoardLog(run_dir)  # RUN_DIR[/replica_<g>]/tensorboard

    def log(self, record: dict[str, Any], step: int, bar: tqdm | None = None) -> None:
        """Append ``record`` to ``metrics.jsonl`` and TensorBoard (at its ``step``, else
        ``step``) and print it as one line (through ``bar`` when a progress bar is shown)."""
        if not self.is_main:
            return
        if self.wall_time:
            record = {**record, "time": round(time.time(), 3)}
        self._metrics.write(json.dumps(record) + "\n")
        self._metrics.flush()
        if self._tensorboard is not None:
            self._tensorboard.write(record, step)
        self.say(
            record["kind"],
            " ".join(f"{k}={short(v)}" for k, v in record.items() if k != "kind"),
            bar,
        )

    def say(self, kind: str, text: str, bar: tqdm | None = None) -> None:
        """Print ``[kind] <label> text`` on rank 0 (not a record: nothing is written)."""
        if not self.is_main:
            return
        line = f"[{kind}] {self.label + ' ' if self.label else ''}{text}"
        if bar is not None and not bar.disable:
            bar.write(line)
        else:
            print(line, flush=True)

    def write_summary(self, summary: dict[str, Any]) -> None:
        """``summary.json``, replaced whole (a reader never sees half of it)."""
        if not self.is_main:
            return
        path = os.path.join(self.run_dir, "summary.json")
        with open(path + ".tmp", "w") as f:
            json.dump(summary, f, indent=2)
        os.replace(path + ".tmp", path)

    def close(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None


def short(value: Any) -> str:
    """A value as one printed field: 4 significant digits, the environment stamp on one line."""
    if isinstance(value, dict) and "torch" in value and "git_commit" in value:
        return f"({one_line(value)})"  # the environment stamp, readable
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.3e}"
    return str(value)
