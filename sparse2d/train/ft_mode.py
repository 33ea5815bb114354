"""The trainer's fault-tolerant mode (``fault_tolerance.enable``): this torchrun world is one
sharding group of a torchft job, driven by ``sparse2d.ft.FaultTolerance``.

Group ``g``'s rank ``r`` reads slice ``g*L + r`` of each global batch (a 1D run's slices). The
data position advances on every attempted step and heals with the state, so a restarted group
skips the steps it was down for (``samples_skipped``), never trains them twice. A step is an
attempt (quorum, forward, backward, vote); a failed commit moves nothing. A pipeline is built
after the first quorum, so a restarted group heals before its first prefetch. A group writes
to ``RUN_DIR/replica_<g>/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

import torch.distributed as dist

from sparse2d import checkpoint
from sparse2d.comm_device import share_from_rank0
from sparse2d.errors import FaultToleranceError
from sparse2d.ft import commit_log
from sparse2d.ft.heal_log import HealLog
from sparse2d.ft.state import digest
from sparse2d.managed_collision import mc_identity_buffers
from sparse2d.train.config import Config
from sparse2d.train.data import DataSource
from sparse2d.train.pipeline import PipelineSteps
from sparse2d.train.step_mode import Attempt, Run, name_partial_saves


def config_digest(cfg: Config) -> dict[str, str]:
    """What every group must agree on, by dotted key (not its replica id or output paths): a
    group joining with another value is refused naming the key (``FaultTolerance``)."""
    keep = {
        k: v for k, v in cfg.to_dict().items() if k in ("model", "data", "parallel", "optimizer")
    }
    keep["train"] = {"steps": cfg.train.steps, "pipeline": cfg.train.pipeline}
    out: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), inner)
        else:
            out[prefix] = json.dumps(value, sort_keys=True, default=str)

    walk("", keep)
    return out


def check_lighthouse(cfg: Config) -> None:
    """On every rank before any process group forms: the lighthouse answers and serves this
    job (``sparse2d.ft.lighthouse.check_job``), so a group of another job stops in one line
    in seconds, not after its model is built. (The manager checks again when it connects.)"""
    from sparse2d.ft.lighthouse import check_job, check_reachable

    ft = cfg.fault_tolerance
    address = ft.lighthouse_address()
    check_reachable(address, ft.connect_timeout_s)
    check_job(address, ft.job_id(), ft.connect_timeout_s)


class FaultTolerantMode:
    """``sparse2d.train.step_mode.Mode`` for one group of a torchft job (module docstring)."""

    wall_time = True  # records carry the wall time: stalls and heals across groups

    def __init__(self, cfg: Config, rank: int, size: int) -> None:
        ft = cfg.fault_tolerance
        self.cfg, self.rank, self.size = cfg, rank, size
        self.group, self.groups = ft.replica_id, ft.num_groups
        self.label = f"replica={self.group}"
        self.run_dir = os.path.join(cfg.run_dir, f"replica_{self.group}")
        root = cfg.checkpoint.dir or cfg.run_dir  # each group saves alone (collective inside)
        self.checkpoint_dir = os.path.join(root, f"replica_{self.group}", "checkpoints")
        self.restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.trained_to = _last_train_step(os.path.join(self.run_dir, "metrics.jsonl"))
        """The furthest step this group logged before this process (0: none)."""
        self.had_progress = self.trained_to > 0
        launched = os.environ.get("SPARSE2D_FT_LAUNCH_TIME")
        self.rejoins = launched is not None and _trained_since(
            os.path.join(self.run_dir, "metrics.jsonl"), float(launched)
        )
        """This group trained in this job (the launcher's launch time) before this process:
        a host's relaunch, which rejoins the live groups instead of waiting for all."""
        self.samples_per_group = size * cfg.data.batch_size_per_rank
        self.heal_log = HealLog(self.run_dir, fresh_launch=self.restart == 0) if rank == 0 else None
        self._heals_seen = 0
        self._first = True
        self._pipeline: Any = None
        self._participants = 0

    def data(self, rank: int, world: int) -> tuple[DataSource, DataSource]:
        train = DataSource(self.cfg, self.group * self.size + self.rank, self.groups * self.size)
        return train, DataSource(self.cfg, self.rank, self.size)  # every group: one eval set

    def attach(self, run: Run) -> None:
        """The torchft manager, built last: a group heartbeating before it can train would
        hold back the live groups' quorum (the lighthouse waits for heartbeating groups)."""
        # here, not at the top: torchft loads only in a fault-tolerant run (the loop imports
        # this module for every run; ``import sparse2d.ft`` itself loads no torchft)
        from sparse2d.ft import FaultTolerance

        # a restarted group rejoins a running job (or finds every group lost): no start wait.
        # A host's relaunch is torchrun restart 0 again, but its group logged steps in this
        # job: its start wait polled the lighthouse ~120 times, each poll a new quorum that
        # tore down the live groups' process group, so their steps failed for minutes
        # (bench/chaos.py: a host killed twice while healing)
        ft = self.cfg.fault_tolerance
        fresh = self.restart == 0 and not self.rejoins
        options = ft.options() if fresh else ft.options(start_wait_s=1e-9)
        self.ft = FaultTolerance(
            run.model, run.optimizer, options, config_digest=config_digest(self.cfg)
        )
        self.ft.final_step = self.cfg.train.steps  # the last step syncs whatever the cadence
        if ft.commit_log and self.rank == 0:
            launched = os.environ.get("SPARSE2D_FT_LAUNCH_TIME")
            fresh = commit_log.stale(
                self.run_dir, float(launched) if launched else None, self.restart
            )
            self._commits = commit_log.CommitLog(self.run_dir, fresh)
            self.ft.on_commit = self._log_commit

    def _log_commit(self, participants: int) -> None:
        """One line of ``commits.jsonl`` for the step that just committed (rank 0's state)."""
        ft = self.ft
        self._commits.append(
            {
                "step": ft.manager.current_step(),
                "quorum_id": int(getattr(ft.manager, "_quorum_id", -1)),
                "participants": participants,
                "digest": digest(ft.model, ft.shards, mc_identity_buffers(ft.policy)),
                "pid": os.getpid(),
                "time": time.time(),
            }
        )

    @property
    def completed(self) -> int:
        return self.ft.step

    def shape(self, run: Run) -> dict[str, int]:
        return {
            "world_size": self.groups * self.size,
            "sharding_group_size": run.model.sharding_group_size,
            "num_replicas": self.groups,
        }

    def header(self, run: Run) -> dict[str, Any]:
        return {
            "group_size": self.size,
            "groups": self.groups,
            "restart": self.restart,
            "pid": os.getpid(),
            "position": self.ft.position,
        }

    # ---- a step ------------------------------------------------------------------------
    def attempt(self, run: Run) -> Attempt | None:
        ft = self.ft
        startup_s, first = 0.0, self._first
        if first:
            joined = time.perf_counter()
            if not self._join(run):
                return None
            startup_s = time.perf_counter() - joined
        if self._pipeline is None:
            ft.start_step()  # quorum; a group behind heals here (already open at the first)
            if self._back_after_the_job_ended(run, ft.participants):
                return None
            batch = run.data.train(ft.position)[0].to(run.device)  # joins the quorum first
            self._record_heals(run)
            loss, (_, logits, labels) = run.model(batch)
            loss.backward()
            participants = ft.participants
            committed = bool(ft.finish_step())
            ft.verdicts.clear()
        else:  # zero_grad: quorum; step: vote and commit (sparse2d.ft.FTOptimizer)
            logits, labels = self._pipeline.progress()
            # the verdicts that landed in this attempt: the previous step's, at the forward,
            # when it was late (``_may_defer``); this step's own, unless it is late now
            participants, committed = ft.participants, all(ft.verdicts)
            ft.verdicts.clear()
            self._record_heals(run)
        self._participants = participants
        samples = participants * self.samples_per_group
        return Attempt(logits, labels, committed, samples, participants, startup_s)

    def _join(self, run: Run) -> bool:
        """The first quorum. A (re)launch first loads its checkpoint (the quorum then starts
        from the furthest group's, the others heal from it); a torchrun restart that finds
        nobody ahead resumes, or finds the job finished (False: stop) or lost (raises)."""
        ft = self.ft
        if self.restart == 0:
            self._maybe_resume(run)
        ft.start_step()
        # every group was lost: continue from the checkpoint's step; the groups behind it
        # heal at the next quorum (this step's quorum is already formed)
        if not (self.restart and self._maybe_resume(run)) and self._check_not_all_lost(run):
            return False
        self._first = False
        self._record_heals(run)
        self._pipeline = self._build_pipeline(run)
        return True

    def _log(self, run: Run, record: dict[str, Any]) -> None:
        """One record at the job's committed step (as the loop logs its own)."""
        run.recorder.log(record, self.completed)

    def _record_heals(self, run: Run) -> None:
        """Log this process's new heals and append them to the group's heal log."""
        for heal in self.ft.heals[self._heals_seen :]:
            self._log(run, {"kind": "heal", **heal})
            if self.heal_log is not None:
                self.heal_log.append(heal)
        self._heals_seen = len(self.ft.heals)

    def _build_pipeline(self, run: Run) -> Any:
        """TorchRec's train pipeline over the fault-tolerant optimizer wrapper, reading
        batches from the group's data position on (``train.pipeline``), or None."""
        kind = self.cfg.train.pipeline
        if kind == "none":
            return None
        from sparse2d.ft import FTOptimizer  # torchft: as in ``attach``

        ft = self.ft
        wrapper = FTOptimizer(ft, expect_position=ft.position, defer=self._may_defer)
        return PipelineSteps(kind, run.model, wrapper, run.data, run.device, ft.position, None)

    def _may_defer(self, step: int) -> bool:
        """Whether the vote of the step at committed step ``step`` may land at the next
        forward (``sparse2d.ft.commit``): not when the loop evaluates or saves after it, nor
        the last step, so those read a committed state. The loop counts a step done when its
        vote lands, so it moves two steps at once where an immediate vote follows a late one;
        the step before must then land too when the loop logs after it (with ``log_every``
        1, every step), so that each logged step is logged once."""
        cfg, done = self.cfg, step + 1
        logged_before_a_jump = cfg.logs_after(done) and cfg.reads_state_after(done + 1)
        return not (cfg.reads_state_after(done) or logged_before_a_jump or cfg.train.log_every == 1)

    def paused(self) -> contextlib.AbstractContextManager[None]:
        return self._pipeline.paused() if self._pipeline is not None else contextlib.nullcontext()

    # ---- checkpoints and the all-lost case --------------------------------------------------
    def checkpoint_extra(self, step: int, run: Run) -> dict[str, Any]:
        return {
            "step": step,
            "position": self.ft.position,
            "slices_skipped": self.ft.slices_skipped,
        }

    def _maybe_resume(self, run: Run) -> bool:
        """Load this group's latest checkpoint (``train.resume=auto``): at a launch, before
        the first quorum; after a torchrun restart, only when no live group was ahead at the
        first quorum (then every group was lost). A group that a live one can heal reads no
        storage."""
        if self.cfg.train.resume != "auto" or self.ft.step != 0 or self._healed_from_live():
            return False
        if self.rank == 0:
            name_partial_saves(self.checkpoint_dir)
        path = checkpoint.latest(self.checkpoint_dir)
        if path is None:
            return False
        extra = checkpoint.load(path, run.model, dense_optimizer=run.optimizer)
        self.ft.resume(int(extra["step"]), int(extra["position"]), int(extra["slices_skipped"]))
        self._log(run, {"kind": "resume", "step": int(extra["step"]), "path": path})
        return True

    def _healed_from_live(self) -> bool:
        """A heal from a group past step 0 (a heal at step 0 copies a group that is as fresh
        as this one: every group restarted)."""
        return any(h["step"] > 0 for h in self.ft.heals)

    def _finished_by_others(self) -> int | None:
        """A group whose summary says it finished this launch's job (``launch/ft_local.sh``
        exports the launch time), if any: then there is nothing left to rejoin."""
        launched = float(os.environ.get("SPARSE2D_FT_LAUNCH_TIME", "inf"))
        for g in range(self.groups):
            path = os.path.join(self.cfg.run_dir, f"replica_{g}", "summary.json")
            if g != self.group and os.path.exists(path) and os.path.getmtime(path) >= launched:
                with open(path) as f:
                    if json.load(f).get("final_step") == self.cfg.train.steps:
                        return g
        return None

    def _back_after_the_job_ended(self, run: Run, participants: int) -> bool:
        """A group alone in its quorum right after sharing one: the others were lost (train
        on), or they finished the job while this group was cut off from them (its link down
        longer than their remaining steps). Then its state is stale and every step it took
        alone would be one the others never saw: stop cleanly instead (True). Checked once,
        on the step the quorum shrank, before the step's forward."""
        shrank = participants == 1 < self._participants and self.groups > 1
        self._participants = participants
        if not shrank:
            return False
        finisher = self._finisher()
        if finisher is None:
            return False
        self._ended_by(finisher, run, "was cut off from it", self.ft.step)
        return True

    def _finisher(self) -> int | None:
        """``_finished_by_others`` as the whole group sees it (collective inside the group):
        rank 0 reads the files and its answer holds for the group, because ranks reading a
        summary being written a moment apart must not take different ways out."""
        return share_from_rank0(self._finished_by_others, None)

    def _check_not_all_lost(self, run: Run) -> bool:
        """A restarted or relaunched group that finds the job at step 0 with nothing to heal
        from while it had trained before: either the job finished without it (return True:
        stop cleanly) or every group was lost (nothing to resume from without checkpoints:
        raise). A host's relaunch is torchrun restart 0 (``rejoins``): it trained the whole
        job again alone from step 0 when the others had finished before it was back."""
        if not ((self.restart or self.rejoins) and self.had_progress and self.ft.step == 0):
            return False
        if self._healed_from_live():
            return False
        finisher = self._finisher()
        if finisher is not None:
            self._ended_by(finisher, run)
            return True
        raise FaultToleranceError(
            f"group {self.group}: every replica group was lost (restart {self.restart} found "
            "no live group ahead of step 0, and this group had trained before); with "
            "no checkpoint (checkpoint.every=0, or train.resume=none) there is nothing to resume "
            "from: start the job again"
        )

    def _ended_by(
        self, finisher: int, run: Run, how: str = "restarted", last: int | None = None
    ) -> None:
        """This group stops with nothing to rejoin (it ``how``: restarted, or was cut off from
        the others); its ``summary.json`` and its ``final`` line say so, and name the group
        that finished the job. ``last``: its last step (default: the last it logged)."""
        last = self.trained_to if last is None else last
        why = f"group {finisher} finished the job while this group {how}; nothing to rejoin"
        run.recorder.write_summary(
            {
                "ended": why,
                "finished_by_group": finisher,
                "steps": self.cfg.train.steps,
                "final_step": last,
                "restart_count": self.restart,
                "heals": self.heal_log.read() if self.heal_log is not None else [],
            }
        )
        run.recorder.say(
            "done",
            f"{why} (this group's last step {last}) -> {self.run_dir}/summary.json",
        )

    # ---- records -------------------------------------------------------------------------
    def window(self, run: Run, steps: int, last: Attempt) -> dict[str, Any]:
        return {
            "participants": last.participants,
            "committed_steps": self.ft.committed,
            "failed_commits": self.ft.failed,
        }

    def summary(self, run: Run) -> dict[str, Any]:
        """The group's counters; ``heals``: every heal of the group in this launch, its
        restarts' included; ``pids`` and ``state_digests`` per rank (collective)."""
        ft = self.ft
        pids: list[Any] = [None] * self.size
        dist.all_gather_object(pids, os.getpid())
        digests: list[Any] = [None] * self.size  # per rank: equal across groups = identical
        dist.all_gather_object(
            digests, digest(run.model, ft.shards, mc_identity_buffers(ft.policy))
        )
        counters = {k: v for k, v in ft.summary().items() if k != "heals"}
        return {
            "sync_s_per_step": None,  # the sync is inside the step (one vote, one all-reduce)
            **counters,
            "heals": self.heal_log.read() if self.heal_log is not None else list(ft.heals),
            "samples_skipped": ft.slices_skipped * self.samples_per_group,
            "restart_count": self.restart,
            "pids": pids,
            "state_digests": digests,
        }

    def final_text(self, summary: dict[str, Any]) -> str:
        return (
            f"committed={summary['committed_steps']} failed={summary['failed_commits']} "
            f"heals={len(summary['heals'])} "
        )

    def close(self) -> None:
        """Stop this group's torchft manager."""
        self.ft.shutdown()


def _last_train_step(metrics: str) -> int:
    """The step of the last ``train`` record in ``metrics`` (0: no file, no such record)."""
    if not os.path.exists(metrics):
        return 0
    with open(metrics) as f:
        steps = [json.loads(line).get("step", 0) for line in f if '"kind": "train"' in line]
    return int(steps[-1]) if steps else 0


def _trained_since(metrics: str, since: float) -> bool:
    """Whether ``metrics`` holds a ``train`` record logged at or after ``since`` (wall time)."""
    if not os.path.exists(metrics):
        return False
    with open(metrics) as f:
        for line in f:
            if '"kind": "train"' not in line:
                continue
            try:
                if json.loads(line).get("time", 0) >= since:
                    return True
            except json.JSONDecodeError:  # a line cut by a kill
                continue
    return False
