"""``--profile``: a ``torch.profiler`` trace of a few training steps on rank 0.

The trace (Chrome/Perfetto JSON, open in ``chrome://tracing`` or ui.perfetto.dev)
and a table of the most expensive ops are written to ``RUN_DIR/profile/``. The
schedule skips the first steps (planning, first-touch allocations, warm-up of
gloo connections) and records a handful of steady-state ones; phases of the step
are labelled (``sparse2d.data``, ``sparse2d.step``, ``sparse2d.sync``) by the loop.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

TRACE = "trace_rank0.json"
TOP_OPS = "top_ops.txt"


class StepProfiler:
    """Profiles steps ``[wait + warmup, wait + warmup + active)`` of a run of ``steps``."""

    def __init__(self, enabled: bool, run_dir: str, steps: int) -> None:
        self.directory = os.path.join(run_dir, "profile")
        self._prof: Any = None
        if not enabled:
            return
        wait = min(10, steps // 4)
        warmup = min(2, max(0, steps - wait - 1))
        active = max(1, min(5, steps - wait - warmup))
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._prof = profile(
            activities=activities,
            schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
            on_trace_ready=self._write,
        )
        self._prof.__enter__()

    @property
    def enabled(self) -> bool:
        return self._prof is not None

    def step(self) -> None:
        """Mark the end of a training step."""
        if self._prof is not None:
            self._prof.step()

    def close(self) -> None:
        """Stop profiling; a run shorter than the schedule still writes what it recorded."""
        if self._prof is not None:
            prof, self._prof = self._prof, None
            prof.__exit__(None, None, None)

    def _write(self, prof: profile) -> None:
        os.makedirs(self.directory, exist_ok=True)
        prof.export_chrome_trace(os.path.join(self.directory, TRACE))
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
        with open(os.path.join(self.directory, TOP_OPS), "w") as f:
            f.write(table + "\n")
