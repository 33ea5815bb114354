"""The training loop behind ``sparse2d.train`` (model build, steps, eval, logs, summary)."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from tqdm import tqdm

from sparse2d.environment import environment, one_line
from sparse2d.train.auto_trial import log_trial
from sparse2d.train.config import Config, dump_yaml
from sparse2d.train.data import DataSource
from sparse2d.train.failure import gather_peers
from sparse2d.train.metrics import TrainWindow, evaluate_batches
from sparse2d.train.pipeline import make_steps
from sparse2d.train.profiling import StepProfiler


class Loop:
    """One training run on an initialized process group (every rank builds one)."""

    def __init__(self, cfg: Config, device: torch.device, profile: bool = False) -> None:
        from sparse2d.train.model import build_model, dense_optimizer, shard

        self.cfg, self.device, self.profile = cfg, device, profile
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.is_main = self.rank == 0
        self.step: int | None = None
        """The step being run (named when a peer is lost)."""
        self.peers = gather_peers()
        if self.is_main:
            os.makedirs(cfg.run_dir, exist_ok=True)
            with open(os.path.join(cfg.run_dir, "config.yaml"), "w") as f:
                f.write(dump_yaml(cfg))
            self._metrics = open(os.path.join(cfg.run_dir, "metrics.jsonl"), "a")  # noqa: SIM115
        self._tensorboard = None
        if self.is_main and cfg.metrics.tensorboard:
            from sparse2d.train.tensorboard_log import TensorBoardLog

            self._tensorboard = TensorBoardLog(cfg.run_dir)
        cache_dir = cfg.data.criteo.cache_dir or os.path.join(cfg.run_dir, "criteo_cache")
        if cfg.data.source == "criteo":
            from sparse2d.train.data.criteo import prepare_everywhere

            local_rank = int(os.environ.get("LOCAL_RANK", "0"))
            for line in prepare_everywhere(cfg.data.criteo, cache_dir, local_rank):
                if self.is_main:  # bad rows are skipped, counted and named once per file
                    print(f"[data] {line}", flush=True)
        self.data = DataSource(cfg, self.rank, self.world, cache_dir)
        self.model = shard(cfg, build_model(cfg, device), device, self.world)
        self.optimizer = dense_optimizer(cfg, self.model)
        self.start_step = 0
        self.sync_s = self.sync_bytes = 0.0
        self.train_s = 0.0
        self.planted: dict[str, float] = {}
        self._maybe_resume()
        self.steps = make_steps(
            cfg.train.pipeline,
            self.model,
            self.optimizer,
            self.data,
            device,
            self.start_step,
            cfg.train.steps,
        )

    # ---- helpers ---------------------------------------------------------------------
    def _show_bar(self) -> bool:
        """A bar only on rank 0 and only on a terminal: a log file gets log lines, not frames."""
        return self.is_main and self.cfg.train.progress_bar and sys.stderr.isatty()

    def log(self, record: dict[str, Any], bar: tqdm | None = None) -> None:
        if not self.is_main:
            return
        self._metrics.write(json.dumps(record) + "\n")
        self._metrics.flush()
        if self._tensorboard is not None:
            self._tensorboard.write(record, self.start_step if self.step is None else self.step + 1)
        text = " ".join(f"{k}={_short(v)}" for k, v in record.items() if k != "kind")
        line = f"[{record['kind']}] {text}"
        if bar is not None and not bar.disable:
            bar.write(line)
        else:
            print(line, flush=True)

    def _max(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        self.model.sync_policy.finish()
        with self.steps.paused():
            metrics = evaluate_batches(
                self.model, self.data, self.cfg.train.eval_batches, self.device
            )
        for key in ("planted_auc", "planted_ne"):
            if key in metrics:
                self.planted[key] = metrics.pop(key)
        return metrics

    # ---- checkpoints (sparse2d.checkpoint: DCP, atomic ``latest``, keep=K) ---------------
    def _maybe_resume(self) -> None:
        if self.cfg.train.resume != "auto":
            return
        from sparse2d import checkpoint

        path = checkpoint.latest(self.cfg.checkpoint_dir)
        if path is None:
            if self.is_main:
                print(f"[resume] no checkpoint in {self.cfg.checkpoint_dir}; from step 0")
            return
        older = list(reversed(checkpoint.list_checkpoints(self.cfg.checkpoint_dir)))
        for candidate in [path, *(p for p in older if p != path)]:
            try:  # verified before anything changes: a damaged one leaves the model as it was
                extra = checkpoint.load(candidate, self.model, dense_optimizer=self.optimizer)
            except checkpoint.CorruptCheckpointError as error:
                if self.is_main:
                    print(f"[resume] skipping damaged {candidate}: {error}", flush=True)
                continue
            path = candidate
            break
        else:
            raise checkpoint.CheckpointError(
                f"every checkpoint in {self.cfg.checkpoint_dir!r} is damaged (see the [resume] "
                "lines); delete them or set train.resume=none to start from step 0"
            )
        self.start_step = int(extra["step"])
        if self.is_main:
            print(f"[resume] {path}: step {self.start_step}", flush=True)

    def _maybe_save(self, step: int, last: bool) -> None:
        every = self.cfg.checkpoint.every
        if every == 0 or ((step + 1) % every and not last):
            return
        from sparse2d import checkpoint

        extra = {"step": step + 1, "global_sample": (step + 1) * self.data.global_batch}
        path = checkpoint.save(
            self.cfg.checkpoint_dir,
            self.model,
            dense_optimizer=self.optimizer,
            extra=extra,
            step=step + 1,
            keep=self.cfg.checkpoint.keep,
        )
        self.log({"kind": "checkpoint", "step": step + 1, "path": path})

    def _log_balance(self) -> None:
        """Per-rank balance of the built plan: max/mean lookup load and shard memory."""
        from sparse2d.planner.balance import local_load, max_over_mean
        from sparse2d.train.plan import workload_from_config

        tables = workload_from_config(self.cfg).tables
        mine = local_load(self.model.shard_states, tables, self.model.sharding_group_size,
                          self.cfg.data.batch_size_per_rank)  # fmt: skip
        loads: list[Any] = [None] * self.world
        dist.all_gather_object(loads, mine)
        lookup, memory = [x for x, _ in loads], [m for _, m in loads]
        self.log({"kind": "balance", "lookup_max_over_mean": max_over_mean(lookup),
                  "memory_max_over_mean": max_over_mean(memory), "memory_max_bytes": max(memory)})  # fmt: skip

    # ---- the loop --------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        cfg, model = self.cfg, self.model
        t = cfg.train
        steps, every = t.steps, cfg.parallel.sync.every
        self.environment = (  # rank 0 writes it; no git calls from every rank of a big job
            environment(
                backend=dist.get_backend(),
                device_type=self.device.type,
                world_size=self.world,
                hosts=len({host for host, _ in self.peers}),
            )
            if self.is_main
            else {}
        )
        header = {
            "kind": "start",
            "world_size": self.world,
            "sharding_group_size": model.sharding_group_size,
            "num_replicas": model.num_replicas,
            "global_batch_size": self.data.global_batch,
            "device": str(self.device),
            "sync_every": every,
            "pipeline": t.pipeline,
            "environment": self.environment,
            "construction": model.construction.record(),  # sparse2d.construction (issue 32)
        }
        self.log(header)
        trial = log_trial(model, self.log, self.is_main)  # measured auto: its table and record
        self._log_balance()
        bar = tqdm(
            total=steps, initial=self.start_step, disable=not self._show_bar(),
            dynamic_ncols=True, mininterval=2.0, desc="train",
        )  # fmt: skip
        window = TrainWindow()
        last_train: dict[str, float] = {}
        last_eval: dict[str, float] = {}
        win_s, win_steps, win_sync_s, win_bytes = 0.0, 0, 0.0, 0.0
        divergence: float | None = None
        profiler = StepProfiler(self.profile and self.is_main, cfg.run_dir, steps - self.start_step)
        for step in range(self.start_step, steps):
            self.step = step
            last = step == steps - 1
            start = time.perf_counter()
            logits, labels, report = self.steps.run(step, self.device, model.maybe_sync)
            if last and (step + 1) % every:  # end on averaged replicas
                model.sync_policy.finish()
                report = model.sync_policy.sync_now(step)
            if report is not None:
                win_sync_s += report.seconds
                win_bytes += report.bytes
                if report.divergence is not None:
                    divergence = report.divergence
            win_s += time.perf_counter() - start
            if profiler.enabled:
                # Land the hidden sync first: an async gloo work recorded by the profiler that
                # completes after the profiler stopped segfaulted rank 0 (waited in _land_hook).
                # Landing early is exact (the average is the same whenever it lands) and local.
                model.sync_policy.land()
            profiler.step()
            window.update(logits, labels)
            win_steps += 1
            bar.update(1)
            if (step + 1) % t.log_every == 0 or last:
                elapsed = self._max([win_s])[0]
                self.train_s += elapsed
                sync_s, nbytes = self._max([win_sync_s, win_bytes])
                self.sync_s += sync_s
                self.sync_bytes += nbytes
                last_train = window.reduce()
                record = {"kind": "train", "step": step + 1, **last_train}
                record["samples_per_s"] = self.data.global_batch * win_steps / elapsed
                record["sync_s_per_step"] = sync_s / win_steps
                record["sync_bytes_per_step"] = nbytes / win_steps
                # syncs so far per mode: the engine's choices, and those folded into DDP
                record["sync_modes"] = {
                    **model.sync_policy.mode_counts,
                    "folded": model.sync_policy.folds,
                }
                if divergence is not None:  # replica distance before the latest measured sync
                    record["replica_divergence"] = divergence
                    divergence = None
                self.log(record, bar)
                bar.set_postfix(loss=f"{last_train.get('train_loss', float('nan')):.4f}")
                win_s, win_steps, win_sync_s, win_bytes = 0.0, 0, 0.0, 0.0
            if last or (t.eval_every and (step + 1) % t.eval_every == 0):
                last_eval = self.evaluate()
                self.log({"kind": "eval", "step": step + 1, **last_eval, **self.planted}, bar)
            self._maybe_save(step, last)
        bar.close()
        profiler.close()
        model.sync_policy.finish()
        done = max(1, steps - self.start_step)
        summary = {
            "steps": steps,
            "global_batch_size": self.data.global_batch,
            "batch_size_per_rank": cfg.data.batch_size_per_rank,
            "world_size": self.world,
            "sharding_group_size": model.sharding_group_size,
            "num_replicas": model.num_replicas,
            "replica_layout": cfg.parallel.replica_layout,
            "sync_every": every,
            "pipeline": t.pipeline,
            "data_source": cfg.data.source,
            "device": str(self.device),
            "train_loss": last_train.get("train_loss"),
            "train_auc": last_train.get("train_auc"),
            "train_ne": last_train.get("train_ne"),
            **{k: v for k, v in last_eval.items()},
            **self.planted,
            "samples_per_s": self.data.global_batch * done / max(self.train_s, 1e-9),
            "sync_s_per_step": self.sync_s / done,
            "sync_bytes_per_step": self.sync_bytes / done,
            "train_s": self.train_s,
            # engine "auto": syncs per mode (what it chose), e.g. {"dense": 297, "sparse": 3}
            "sync_modes": model.sync_policy.mode_counts,
            # syncs whose NaN/inf vote rode DDP's gradient all-reduce (sync.ddp_vote)
            "sync_votes_in_ddp": model.sync_policy.votes_carried,
            "syncs_folded_into_ddp": model.sync_policy.folds,
            # which code and libraries made these numbers (sparse2d/environment.py)
            "environment": self.environment,
            "construction": model.construction.record(),  # sparse2d.construction (issue 32)
            **trial,
        }
        if self.is_main:
            with open(os.path.join(cfg.run_dir, "summary.json"), "w") as f:
                json.dump(summary, f, indent=2)
            self._metrics.close()
            if self._tensorboard is not None:
                self._tensorboard.close()
            print(
                f"final step={steps} train_loss={_short(summary['train_loss'])} "
                f"eval_loss={_short(summary.get('eval_loss'))} "
                f"eval_auc={_short(summary.get('eval_auc'))} ne={_short(summary.get('eval_ne'))} "
                + (f"planted_auc={_short(self.planted['planted_auc'])} " if self.planted else "")
                + f"samples/s={summary['samples_per_s']:.1f} "
                f"sync_s/step={summary['sync_s_per_step']:.5f} -> {cfg.run_dir}/summary.json",
                flush=True,
            )
        return summary


def _short(value: Any) -> str:
    if isinstance(value, dict) and "torch" in value and "git_commit" in value:
        return f"({one_line(value)})"  # the environment stamp, readable
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.3e}"
    return str(value)
