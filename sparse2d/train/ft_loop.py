"""The trainer's loop in fault-tolerant mode (``fault_tolerance.enable``): one torchrun world
is one sharding group, driven by ``sparse2d.ft.FaultTolerance``.

Data: at data position ``p`` the job's global batch is ``G x L x B`` samples; group ``g``'s
rank ``r`` reads slice ``g*L + r`` (the same slices a 1D run of ``G*L`` ranks reads). The
position advances on every attempted step and is healed with the rest of the state, so a
restarted group continues at the live groups' position: the slices of the steps it was
down for are skipped (counted in ``samples_skipped``), never trained twice.

Everything a group writes goes to ``RUN_DIR/replica_<id>/`` (``metrics.jsonl``,
``summary.json``, ``config.yaml``).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

import torch
import torch.distributed as dist

from sparse2d.errors import FaultToleranceError
from sparse2d.train.config import Config, dump_yaml
from sparse2d.train.data import DataSource
from sparse2d.train.metrics import TrainWindow, evaluate_batches


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


def _earlier_heals(metrics: str) -> list[dict[str, Any]]:
    """The heal records this launch (``SPARSE2D_FT_LAUNCH_TIME``) logged before this process."""
    launched = float(os.environ.get("SPARSE2D_FT_LAUNCH_TIME", "0"))
    if not os.path.exists(metrics):
        return []
    with open(metrics) as f:
        records = [json.loads(line) for line in f if '"kind": "heal"' in line]
    drop = ("kind", "time")
    return [
        {k: v for k, v in r.items() if k not in drop}
        for r in records
        if r.get("time", 0) >= launched
    ]


class FTLoop:
    """One group's run: quorum, heal, train, vote; eval and summary at the end."""

    def __init__(self, cfg: Config, device: torch.device) -> None:
        from sparse2d.ft import FaultTolerance, FTOptions
        from sparse2d.train.model import build_model, dense_optimizer, shard

        ft = cfg.fault_tolerance
        self.cfg, self.device = cfg, device
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.group, self.groups = ft.replica_id, ft.group_size
        self.is_main = self.rank == 0
        self.step: int | None = None
        self.run_dir = os.path.join(cfg.run_dir, f"replica_{self.group}")
        self.restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        metrics = os.path.join(self.run_dir, "metrics.jsonl")
        self.had_progress = os.path.exists(metrics) and '"kind": "train"' in open(metrics).read()
        self.earlier_heals = _earlier_heals(metrics) if self.restart else []
        """Heals of this group's earlier processes in this launch (a summary lists them all)."""
        if self.is_main:
            os.makedirs(self.run_dir, exist_ok=True)
            with open(os.path.join(self.run_dir, "config.yaml"), "w") as f:
                f.write(dump_yaml(cfg))
            self._metrics = open(metrics, "a")  # noqa: SIM115
        self._tensorboard = None
        if self.is_main and cfg.metrics.tensorboard:
            from sparse2d.train.tensorboard_log import TensorBoardLog

            self._tensorboard = TensorBoardLog(self.run_dir)  # RUN_DIR/replica_<id>/tensorboard
        slice_rank = self.group * self.size + self.rank
        self.data = DataSource(cfg, slice_rank, self.groups * self.size)
        self.eval_data = DataSource(cfg, self.rank, self.size)  # every group: the same eval set
        self.model = shard(cfg, build_model(cfg, device), device, self.size)
        self.optimizer = dense_optimizer(cfg, self.model)
        options = FTOptions(
            replica_id=self.group,
            num_groups=self.groups,
            min_replica_size=ft.min_replica_size,
            lighthouse=ft.lighthouse,
            sync_every=cfg.parallel.sync.every,
            timeout_s=ft.timeout_s,
            quorum_timeout_s=ft.quorum_timeout_s,
            connect_timeout_s=ft.connect_timeout_s,
            # a restarted group rejoins a running job (or finds every group lost): no start wait
            start_wait_s=ft.start_wait_s if self.restart == 0 else 1e-9,
        )
        # The manager is built last: a group heartbeating before it can train would hold
        # back the live groups' quorum (the lighthouse waits for heartbeating groups).
        self.ft = FaultTolerance(
            self.model, self.optimizer, options, config_digest=config_digest(cfg)
        )

    def log(self, record: dict[str, Any]) -> None:
        if not self.is_main:
            return
        record = {**record, "time": round(time.time(), 3)}  # wall clock: stalls, heal timing
        self._metrics.write(json.dumps(record) + "\n")
        self._metrics.flush()
        if self._tensorboard is not None:
            self._tensorboard.write(record, record.get("step") or self.ft.step)
        text = " ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in record.items()
            if k != "kind"
        )
        print(f"[{record['kind']}] replica={self.group} {text}", flush=True)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        steps = getattr(self, "_steps", None)
        with steps.paused() if steps is not None else contextlib.nullcontext():
            return evaluate_batches(
                self.model, self.eval_data, self.cfg.train.eval_batches, self.device
            )

    @property
    def checkpoint_dir(self) -> str:
        """Each group keeps its own checkpoints (a save is collective inside the group only)."""
        root = self.cfg.checkpoint.dir or self.cfg.run_dir
        return os.path.join(root, f"replica_{self.group}", "checkpoints")

    def _maybe_save(self) -> None:
        every, step = self.cfg.checkpoint.every, self.ft.step
        if not every or (step % every and step != self.cfg.train.steps):
            return
        from sparse2d import checkpoint

        extra = {
            "step": step,
            "position": self.ft.position,
            "slices_skipped": self.ft.slices_skipped,
        }
        path = checkpoint.save(self.checkpoint_dir, self.model, dense_optimizer=self.optimizer,
                               extra=extra, step=step, keep=self.cfg.checkpoint.keep)  # fmt: skip
        self.log({"kind": "checkpoint", "step": step, "path": path})

    def _maybe_resume(self) -> bool:
        """Load this group's latest checkpoint (``train.resume=auto``): at a launch, before
        the first quorum; after a torchrun restart, only when no live group was ahead at the
        first quorum (then every group was lost). A group that a live one can heal reads no
        storage."""
        if self.cfg.train.resume != "auto" or self.ft.step != 0 or self._healed_from_live():
            return False
        from sparse2d import checkpoint

        path = checkpoint.latest(self.checkpoint_dir)
        if path is None:
            return False
        extra = checkpoint.load(path, self.model, dense_optimizer=self.optimizer)
        self.ft.resume(int(extra["step"]), int(extra["position"]), int(extra["slices_skipped"]))
        self.log({"kind": "resume", "step": int(extra["step"]), "path": path})
        return True

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

    def _healed_from_live(self) -> bool:
        """A heal from a group past step 0 (a heal at step 0 copies a group that is as fresh
        as this one: every group restarted)."""
        return any(h["step"] > 0 for h in self.ft.heals)

    def _check_not_all_lost(self) -> bool:
        """A restarted group that finds the job at step 0 with nothing to heal from while it
        had trained before: either the job finished without it (return True: stop cleanly)
        or every group was lost (nothing to resume from without checkpoints: raise)."""
        if not (self.restart and self.had_progress and self.ft.step == 0):
            return False
        if self._healed_from_live():
            return False
        done = self._finished_by_others()
        if done is not None:
            if self.is_main:
                print(f"[done] replica={self.group}: group {done} finished the job while this "
                      "group restarted; nothing to rejoin", flush=True)  # fmt: skip
            return True
        raise FaultToleranceError(
            f"group {self.group}: every replica group was lost (restart {self.restart} found "
            "no live group ahead of step 0, and this group had trained before); with "
            "no checkpoint (checkpoint.every=0, or train.resume=none) there is nothing to resume "
            "from: start the job again"
        )

    def _pipeline(self) -> Any:
        """TorchRec's train pipeline over the fault-tolerant optimizer wrapper, reading
        batches from the group's data position on (``train.pipeline``), or None."""
        kind = self.cfg.train.pipeline
        if kind == "none":
            return None
        from sparse2d.ft import FTOptimizer
        from sparse2d.train.pipeline import PipelineSteps

        wrapper = FTOptimizer(self.ft, expect_position=self.ft.position)
        self._steps = PipelineSteps(
            kind, self.model, wrapper, self.data, self.device, self.ft.position, None
        )
        return self._steps

    def run(self) -> dict[str, Any]:
        cfg, model, ft = self.cfg, self.model, self.ft
        steps, t = cfg.train.steps, cfg.train
        samples_per_group = self.size * cfg.data.batch_size_per_rank
        self.log({"kind": "start", "group_size": self.size, "groups": self.groups,
                  "restart": self.restart, "pid": os.getpid(), "position": ft.position,
                  "construction": model.construction.record()})  # fmt: skip
        window, last_train = TrainWindow(), {}
        train_s, trained_samples, win_s, win_samples, win_steps = 0.0, 0, 0.0, 0, 0
        first = True
        ft.final_step = steps  # the last step syncs whatever the cadence
        pipeline = None
        if self.restart == 0:  # a (re)launch: the first quorum then starts from the furthest
            self._maybe_resume()  # group's checkpoint, the others heal from it
        while ft.step < steps:
            start = time.perf_counter()
            if pipeline is None:  # a pipeline joins in its optimizer's zero_grad()
                ft.start_step()
            if first:
                # torchrun restarted this group and nobody is ahead: every group was lost.
                if self.restart and self._maybe_resume():  # ask again with the loaded step
                    ft.start_step()
                elif self._check_not_all_lost():
                    self.ft.shutdown()
                    return {}
                first = False
                # The pipeline is built after the first quorum: a restarted group has healed
                # (its data position included) before the pipeline's first prefetch.
                pipeline = self._pipeline()
                # Joining is start-up, like the standard launcher's rendezvous and start
                # broadcast (outside its timed steps): the first quorum's wait for every
                # planned group and the step-0 heal do not count as training time.
                start = time.perf_counter()
            if ft.heals and ft.heals[-1].get("logged") is None:
                ft.heals[-1]["logged"] = True
                self.log(
                    {"kind": "heal", **{k: v for k, v in ft.heals[-1].items() if k != "logged"}}
                )
            self.step = ft.step
            if pipeline is None:
                batch = self.data.train(ft.position)[0].to(self.device)
                loss, (_, logits, labels) = model(batch)
                loss.backward()
                participants = ft.participants
                committed = ft.finish_step()
            else:  # zero_grad: quorum; step: vote and commit (sparse2d.ft.FTOptimizer)
                logits, labels = pipeline.progress()
                participants, committed = ft.participants, bool(ft.last_committed)
            win_s += time.perf_counter() - start
            if not committed:
                self.log(
                    {"kind": "failed_commit", "step": self.step + 1, "participants": participants}
                )
                continue
            window.update(logits, labels)
            win_samples += participants * samples_per_group
            win_steps += 1
            if ft.step % t.log_every == 0 or ft.step == steps:
                last_train = window.reduce()
                train_s += win_s
                trained_samples += win_samples
                self.log({"kind": "train", "step": ft.step, **last_train,
                          "samples_per_s": win_samples / max(win_s, 1e-9),
                          "participants": participants, "committed_steps": ft.committed,
                          "failed_commits": ft.failed})  # fmt: skip
                win_s, win_samples, win_steps = 0.0, 0, 0
            if t.eval_every and ft.step % t.eval_every == 0 and ft.step != steps:
                self.log({"kind": "eval", "step": ft.step, **self.evaluate()})
            self._maybe_save()
        last_eval = self.evaluate()
        self.log({"kind": "eval", "step": ft.step, **last_eval})
        from sparse2d.ft.state import digest

        pids: list[Any] = [None] * self.size
        dist.all_gather_object(pids, os.getpid())
        digests: list[Any] = [None] * self.size  # per rank: equal across groups = identical
        from sparse2d.sync.mc import mc_identity_buffers

        dist.all_gather_object(digests, digest(model, ft.shards, mc_identity_buffers(ft.policy)))
        summary = {
            "steps": steps,
            "global_batch_size": self.groups * samples_per_group,
            "batch_size_per_rank": cfg.data.batch_size_per_rank,
            "world_size": self.groups * self.size,
            "sharding_group_size": self.size,
            "num_replicas": self.groups,
            "sync_every": cfg.parallel.sync.every,
            "device": str(self.device),
            "train_loss": last_train.get("train_loss"),
            "train_auc": last_train.get("train_auc"),
            **last_eval,
            "samples_per_s": trained_samples / max(train_s, 1e-9),
            "sync_s_per_step": None,  # the sync is inside the step (one vote, one all-reduce)
            "train_s": train_s,
            **{k: v for k, v in ft.summary().items()},
            "heals": self.earlier_heals
            + [{k: v for k, v in h.items() if k != "logged"} for h in ft.heals],
            "samples_skipped": ft.slices_skipped * samples_per_group,
            "restart_count": self.restart,
            "construction": model.construction.record(),  # plan store hit or miss (issue 32)
            "pids": pids,
            "state_digests": digests,
        }
        if self.is_main:
            with open(os.path.join(self.run_dir, "summary.json"), "w") as f:
                json.dump(summary, f, indent=2)
            self._metrics.close()
            if self._tensorboard is not None:
                self._tensorboard.close()
            print(f"final replica={self.group} step={ft.step} committed={ft.committed} "
                  f"failed={ft.failed} heals={len(ft.heals)} eval_auc={summary.get('eval_auc')}",
                  flush=True)  # fmt: skip
        ft.shutdown()
        return summary
