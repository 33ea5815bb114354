"""The trainer's in-world mode: one torchrun world holds every replica (2D as designed).

A step always completes. The replica sync runs on its cadence through
``model.maybe_sync`` (plain steps or a TorchRec pipeline, ``sparse2d.train.pipeline``), the
last step ends on averaged replicas, and the sync's reports (seconds, bytes, the engine's
modes, replica divergence) go into the train records and the summary. Resume
(``train.resume=auto``) loads the newest undamaged checkpoint of ``RUN_DIR/checkpoints``.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from sparse2d import checkpoint
from sparse2d.train.config import Config
from sparse2d.train.data import DataSource
from sparse2d.train.metrics import max_over_ranks
from sparse2d.train.pipeline import PipelineSteps, PlainSteps, make_steps
from sparse2d.train.step_mode import Attempt, Run, name_partial_saves


class InWorld:
    """``sparse2d.train.step_mode.Mode`` for in-world 2D (see the module docstring)."""

    label = ""
    wall_time = False

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.run_dir = cfg.run_dir
        self.checkpoint_dir = cfg.checkpoint_dir
        self.start_step = 0
        self._next = 0
        self.steps: PlainSteps | PipelineSteps | None = None
        self.sync_s = self.sync_bytes = 0.0
        self._win_sync_s = self._win_bytes = 0.0
        self._divergence: float | None = None

    def data(self, rank: int, world: int) -> tuple[DataSource, DataSource]:
        cfg = self.cfg
        cache_dir = cfg.data.criteo.cache_dir or os.path.join(cfg.run_dir, "criteo_cache")
        if cfg.data.source == "criteo":
            # here, not at the top: only a Criteo run loads the TSV reader (as DataSource does)
            from sparse2d.train.data.criteo import prepare_everywhere

            local_rank = int(os.environ.get("LOCAL_RANK", "0"))
            for line in prepare_everywhere(cfg.data.criteo, cache_dir, local_rank):
                if rank == 0:  # bad rows are skipped, counted and named once per file
                    print(f"[data] {line}", flush=True)
        data = DataSource(cfg, rank, world, cache_dir)
        if rank == 0:
            for line in data.wrap_lines(cfg.train.steps, cfg.train.eval_batches):
                print(f"[data] {line}", flush=True)
        return data, data

    def attach(self, run: Run) -> None:
        self._maybe_resume(run)
        self._next = self.start_step
        self.steps = make_steps(
            self.cfg.train.pipeline,
            run.model,
            run.optimizer,
            run.data,
            run.device,
            self.start_step,
            self.cfg.train.steps,
        )

    def _maybe_resume(self, run: Run) -> None:
        """The newest checkpoint that loads (``train.resume=auto``); a damaged one is named
        and skipped, verified before anything changes; a save that never completed is named
        and never read."""
        if self.cfg.train.resume != "auto":
            return
        where = self.checkpoint_dir
        if run.is_main:
            name_partial_saves(where)
        path = checkpoint.latest(where)
        if path is None:
            if run.is_main:
                print(f"[resume] no checkpoint in {where}; from step 0")
            return
        older = list(reversed(checkpoint.list_checkpoints(where)))
        for candidate in [path, *(p for p in older if p != path)]:
            try:  # verified before anything changes: a damaged one leaves the model as it was
                extra = checkpoint.load(candidate, run.model, dense_optimizer=run.optimizer)
            except checkpoint.CorruptCheckpointError as error:
                if run.is_main:
                    print(f"[resume] skipping damaged {candidate}: {error}", flush=True)
                continue
            path = candidate
            break
        else:
            raise checkpoint.CheckpointError(
                f"every checkpoint in {where!r} is damaged (see the [resume] lines); delete "
                "them or set train.resume=none to start from step 0"
            )
        self.start_step = int(extra["step"])
        if run.is_main:
            print(f"[resume] {path}: step {self.start_step}", flush=True)

    @property
    def completed(self) -> int:
        return self._next

    def shape(self, run: Run) -> dict[str, int]:
        model = run.model
        return {
            "world_size": run.world,
            "sharding_group_size": model.sharding_group_size,
            "num_replicas": model.num_replicas,
        }

    def header(self, run: Run) -> dict[str, Any]:
        return {}

    def attempt(self, run: Run) -> Attempt:
        """One step; the last one ends on averaged replicas whatever the sync cadence (a
        stream never leaves every row averaged at once: its last step syncs them all)."""
        step = self._next
        if self.steps is None:
            raise RuntimeError("InWorld.attempt before attach")
        logits, labels, report = self.steps.run(step, run.device, run.model.maybe_sync)
        sync = self.cfg.parallel.sync
        if step == self.cfg.train.steps - 1 and (sync.stream or (step + 1) % sync.every):
            run.model.finish_sync()
            report = run.model.sync()
        if report is not None:
            self._win_sync_s += report.seconds + report.wait_seconds
            self._win_bytes += report.bytes
            if report.divergence is not None:
                self._divergence = report.divergence
        self._next += 1
        return Attempt(logits, labels, True, run.data.global_batch)

    def paused(self) -> contextlib.AbstractContextManager[None]:
        return self.steps.paused() if self.steps is not None else contextlib.nullcontext()

    def window(self, run: Run, steps: int, last: Attempt) -> dict[str, Any]:
        """Sync seconds and bytes per step (slowest rank), syncs per mode so far, and the
        replica divergence before the latest measured sync."""
        sync_s, nbytes = max_over_ranks([self._win_sync_s, self._win_bytes])
        self.sync_s += sync_s
        self.sync_bytes += nbytes
        self._win_sync_s = self._win_bytes = 0.0
        out: dict[str, Any] = {
            "sync_s_per_step": sync_s / steps,
            "sync_bytes_per_step": nbytes / steps,
            # syncs so far per mode: the engine's choices
            "sync_modes": mode_counts(run.model),
        }
        if self._divergence is not None:
            out["replica_divergence"] = self._divergence
            self._divergence = None
        return out

    def checkpoint_extra(self, step: int, run: Run) -> dict[str, Any]:
        return {"step": step, "global_sample": step * run.data.global_batch}

    def summary(self, run: Run) -> dict[str, Any]:
        done = max(1, self.cfg.train.steps - self.start_step)
        return {
            "sync_s_per_step": self.sync_s / done,
            "sync_bytes_per_step": self.sync_bytes / done,
            # engine "auto": syncs per mode (what it chose), e.g. {"dense": 297, "sparse": 3}
            "sync_modes": mode_counts(run.model),
        }

    def final_text(self, summary: dict[str, Any]) -> str:
        return f"sync_s/step={summary['sync_s_per_step']:.5f} "

    def close(self) -> None:
        """Nothing to release (the model belongs to the caller)."""


def mode_counts(model: Any) -> dict[str, int]:
    """Syncs per engine mode over every context's policy (``engine="auto"``: what it chose)."""
    total: dict[str, int] = {}
    for policy in model.sync_policies:
        for mode, count in policy.mode_counts.items():
            total[mode] = total.get(mode, 0) + count
    return total
