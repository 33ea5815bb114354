"""The training loop behind ``sparse2d.train`` (model build, steps, eval, logs, summary).

One loop for both trainer modes: in-world 2D (``sparse2d.train.in_world_mode``) and fault
tolerance (``fault_tolerance.enable``, ``sparse2d.train.ft_mode``), which differ only in
how a step is attempted and what it counts (``sparse2d.train.step_mode.Mode``). What a run
leaves in its directory is written by ``sparse2d.train.recorder`` in both.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from tqdm import tqdm

from sparse2d import checkpoint
from sparse2d.advisor.balance import local_load, max_over_mean
from sparse2d.comm_device import flag_device
from sparse2d.environment import environment
from sparse2d.train.advisor_workload import workload_from_config
from sparse2d.train.config import Config
from sparse2d.train.config.paths import launch_job
from sparse2d.train.failure import gather_peers
from sparse2d.train.ft_mode import FaultTolerantMode
from sparse2d.train.in_world_mode import InWorld
from sparse2d.train.link_bytes import LinkBytes
from sparse2d.train.metrics import TrainWindow, evaluate_batches, max_over_ranks
from sparse2d.train.model_builder import build_model, dense_optimizer, shard
from sparse2d.train.profiling import StepProfiler
from sparse2d.train.recorder import Recorder, short
from sparse2d.train.step_mode import Attempt, Mode, Run


class Loop:
    """One training run on an initialized process group (every rank builds one)."""

    def __init__(self, cfg: Config, device: torch.device, profile: bool = False) -> None:
        self.cfg, self.device, self.profile = cfg, device, profile
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.is_main = self.rank == 0
        self.step: int | None = None
        """The step being run (named when a peer is lost)."""
        self.peers = gather_peers()
        self.environment = (  # rank 0 writes it; no git calls from every rank of a big job
            environment(
                backend=dist.get_backend(),
                device_type=device.type,
                world_size=self.world,
                hosts=len({host for host, _ in self.peers}),
            )
            if self.is_main
            else {}
        )
        self.mode: Mode = (  # fault tolerance: this world is one replica group
            FaultTolerantMode(cfg, self.rank, self.world)
            if cfg.fault_tolerance.enable
            else InWorld(cfg)
        )
        self.recorder = Recorder(
            cfg, self.mode.run_dir, self.is_main, self.mode.label, self.mode.wall_time
        )
        self.data, self.eval_data = self.mode.data(self.rank, self.world)
        self.model = shard(cfg, build_model(cfg, device), device, self.world)
        self.optimizer = dense_optimizer(cfg, self.model)
        self.planted: dict[str, float] = {}
        self.train_s = 0.0
        self.trained_samples = 0
        self.trained_steps = 0
        self.link = LinkBytes.from_env()
        self.run_state = Run(
            self.model, self.optimizer, self.data, device, self.world, self.is_main, self.recorder
        )
        """What the mode works on (it never holds the loop)."""
        self.mode.attach(self.run_state)

    # ---- helpers ---------------------------------------------------------------------
    def _show_bar(self) -> bool:
        """A bar only on rank 0 and only on a terminal: a log file gets log lines, not frames."""
        return self.is_main and self.cfg.train.progress_bar and sys.stderr.isatty()

    def log(self, record: dict[str, Any], bar: tqdm | None = None) -> None:
        """One record of ``metrics.jsonl`` (and TensorBoard, and a printed line), rank 0."""
        self.recorder.log(record, self.mode.completed, bar)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        self.model.finish_sync()
        with self.mode.paused():
            metrics = evaluate_batches(
                self.model, self.eval_data, self.cfg.train.eval_batches, self.device
            )
        for key in ("planted_auc", "planted_ne"):
            if key in metrics:
                self.planted[key] = metrics.pop(key)
        return metrics

    def _maybe_save(self, step: int) -> None:
        """A checkpoint after ``step`` steps on the ``checkpoint.every`` cadence and at the
        end (sparse2d.checkpoint: DCP, atomic ``latest``, keep=K)."""
        if not self.cfg.saves_after(step):
            return
        path = checkpoint.save(
            self.mode.checkpoint_dir,
            self.model,
            dense_optimizer=self.optimizer,
            extra=self.mode.checkpoint_extra(step, self.run_state),
            step=step,
            keep=self.cfg.checkpoint.keep,
        )
        self.log({"kind": "checkpoint", "step": step, "path": path})

    def _log_balance(self) -> None:
        """Per-rank balance of the built plan: max/mean lookup load and shard memory."""
        tables = workload_from_config(self.cfg).tables
        mine = local_load(
            self.model.shard_states,
            tables,
            self.model.sharding_group_size,
            self.cfg.data.batch_size_per_rank,
        )
        loads: list[Any] = [None] * self.world
        dist.all_gather_object(loads, mine)
        lookup, memory = [x for x, _ in loads], [m for _, m in loads]
        self.log(
            {
                "kind": "balance",
                "lookup_max_over_mean": max_over_mean(lookup),
                "memory_max_over_mean": max_over_mean(memory),
                "memory_max_bytes": max(memory),
            }
        )

    def _start(self) -> dict[str, Any]:
        """The ``start`` record (job shape, environment stamp, the mode's fields), the ``auto``
        pick's line and record, and the balance record; returns the summary's pick entry."""
        self.log(
            {
                "kind": "start",
                **self.mode.shape(self.run_state),
                "global_batch_size": self.data.global_batch,
                "device": str(self.device),
                "sync_every": self.cfg.parallel.sync.every,
                "pipeline": self.cfg.train.pipeline,
                **self.mode.header(self.run_state),
                "environment": self.environment,
                "job": launch_job(),  # a relaunch of the same job may write here again
                "construction": self.model.construction.record(),  # sparse2d.core.construction (issue 32)
            }
        )
        pick = getattr(self.model, "auto_pick", None)  # auto: the cost model's pick
        picked = {} if pick is None else {"auto_pick": pick.as_json()}
        if pick is not None:
            if self.is_main:
                print(pick.line(), flush=True)
            self.log({"kind": "auto_pick", **picked["auto_pick"]})
        self._log_balance()
        return picked

    # ---- the loop --------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        cfg, mode = self.cfg, self.mode
        steps = cfg.train.steps
        picked = self._start()
        bar = tqdm(
            total=steps,
            initial=mode.completed,
            disable=not self._show_bar(),
            dynamic_ncols=True,
            mininterval=2.0,
            desc="train",
        )
        window, clock = TrainWindow(), _Clock()
        last_train: dict[str, float] = {}
        profiler = StepProfiler(self.profile and self.is_main, cfg.run_dir, steps - mode.completed)
        last_done = mode.completed
        self.link.resume()
        while mode.completed < steps:
            self.step = mode.completed
            start = time.perf_counter()
            attempt = mode.attempt(self.run_state)
            if attempt is None:  # nothing left for this process (fault tolerance): stop
                bar.close()
                profiler.close()
                self.recorder.close()
                mode.close()
                return {}
            clock.seconds += time.perf_counter() - start - attempt.startup_s
            if not attempt.committed:
                self.log(
                    {
                        "kind": "failed_commit",
                        "step": self.step + 1,
                        "participants": attempt.participants,
                    }
                )
                continue
            if profiler.enabled:
                # Land the hidden sync first: an async gloo work recorded by the profiler that
                # completes after the profiler stopped segfaulted rank 0 (waited in _land_hook).
                # Landing early is exact (the average is the same whenever it lands) and local.
                self.model.finish_sync()
            profiler.step()
            window.update(attempt.logits, attempt.labels)
            clock.add(attempt)
            done = mode.completed
            if done == last_done:  # its commit lands at the next forward (fault tolerance)
                continue
            bar.update(done - last_done)
            last_done = done
            if cfg.logs_after(done):
                last_train = self._log_train(window, clock, attempt, bar)
            if cfg.evaluates_after(done) or cfg.saves_after(done):
                self.link.pause()  # their traffic is not the step's
                if cfg.evaluates_after(done):
                    metrics = self.evaluate()
                    self.log({"kind": "eval", "step": done, **metrics, **self.planted}, bar)
                self._maybe_save(done)
                self.link.resume()
        self.link.pause()
        bar.close()
        profiler.close()
        self._land_counted()
        last_eval = self.evaluate()
        self.log({"kind": "eval", "step": mode.completed, **last_eval, **self.planted})
        return self._finish(last_train, last_eval, picked)

    def _log_train(
        self, window: TrainWindow, clock: _Clock, attempt: Attempt, bar: tqdm
    ) -> dict[str, float]:
        """The ``train`` record of the steps since the last one (collective)."""
        elapsed = max_over_ranks([clock.seconds])[0]
        self.train_s += elapsed
        self.trained_samples += clock.samples
        self.trained_steps += clock.steps
        last_train = window.reduce()
        record = {"kind": "train", "step": self.mode.completed, **last_train}
        record["samples_per_s"] = clock.samples / max(elapsed, 1e-9)
        record.update(self.mode.window(self.run_state, clock.steps, attempt))
        self.log(record, bar)
        bar.set_postfix(loss=f"{last_train.get('train_loss', float('nan')):.4f}")
        clock.reset()
        return last_train

    def _finish(
        self, last_train: dict[str, float], last_eval: dict[str, float], picked: dict[str, Any]
    ) -> dict[str, Any]:
        """``summary.json`` (both modes' keys, then the mode's), the ``final`` line."""
        cfg, model = self.cfg, self.model
        summary = {
            "steps": cfg.train.steps,
            "global_batch_size": self.data.global_batch,
            "batch_size_per_rank": cfg.data.batch_size_per_rank,
            **self.mode.shape(self.run_state),
            "replica_layout": model.replica_layout,
            "sync_every": cfg.parallel.sync.every,
            "pipeline": cfg.train.pipeline,
            "data_source": cfg.data.source,
            "device": str(self.device),
            "train_loss": last_train.get("train_loss"),
            "train_auc": last_train.get("train_auc"),
            "train_ne": last_train.get("train_ne"),
            **last_eval,
            **self.planted,
            "samples_per_s": self.trained_samples / max(self.train_s, 1e-9),
            "train_s": self.train_s,
            **self._link_summary(),
            # which code and libraries made these numbers (sparse2d/environment.py)
            "environment": self.environment,
            "construction": model.construction.record(),  # sparse2d.core.construction (issue 32)
            **picked,
            **self.mode.summary(self.run_state),
        }
        self.recorder.write_summary(summary)
        self.recorder.close()
        if self.is_main:
            label = f"{self.mode.label} " if self.mode.label else ""
            print(
                f"final {label}step={self.mode.completed} "
                f"train_loss={short(summary['train_loss'])} "
                f"eval_loss={short(summary.get('eval_loss'))} "
                f"eval_auc={short(summary.get('eval_auc'))} ne={short(summary.get('eval_ne'))} "
                + (f"planted_auc={short(self.planted['planted_auc'])} " if self.planted else "")
                + f"samples/s={summary['samples_per_s']:.1f} {self.mode.final_text(summary)}"
                f"-> {self.mode.run_dir}/summary.json",
                flush=True,
            )
        self.mode.close()
        return summary

    def _land_counted(self) -> None:
        """Land the syncs still in flight, counting their link bytes: the sync started at the
        last step is the steps' traffic (one in every ``sync.every`` steps), though no step
        waits for it. A barrier after it, so no host stops counting before every replica
        ring of it (another rank's) has finished crossing its link. Not timed as a step."""
        if not self.link.enabled:
            self.model.finish_sync()
            return
        self.link.resume()
        self.model.finish_sync()
        dist.barrier()
        self.link.pause(landing=True)

    def _link_summary(self) -> dict[str, Any]:
        """``host_link_bytes_per_step``: bytes that crossed host links per training step,
        summed over hosts, the last step's sync included; ``host_link_packets_per_step``
        (their framing: ``link_bytes.FRAME_HEADER_BYTES`` each) and
        ``host_link_landing_bytes`` (the part sent while that sync landed). Collective; only
        where ``GLOO_SOCKET_IFNAME`` names the link."""
        if not self.link.enabled:
            return {}
        link = self.link
        counts = [float(link.total), float(link.packets), float(link.landing)]
        t = torch.tensor(counts, dtype=torch.float64, device=flag_device())
        dist.all_reduce(t)
        total, packets, landing = t.tolist()
        steps = max(self.trained_steps, 1)
        return {
            "host_link_interface": link.interface,
            "host_link_bytes_per_step": total / steps,
            "host_link_packets_per_step": packets / steps,
            "host_link_landing_bytes": landing,
        }


class _Clock:
    """Seconds, samples and steps of the current train window (this rank's)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.seconds, self.samples, self.steps = 0.0, 0, 0

    def add(self, attempt: Attempt) -> None:
        self.samples += attempt.samples
        self.steps += 1
