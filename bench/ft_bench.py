"""Fault-tolerant 2D (torchft, launch/ft_local.sh) vs the standard launcher (launch/local.sh).

Same model and data (configs/ft_tiny_cpu.yaml's: tiny_cpu's 8 tables), 4 gloo processes,
global batch 512, sync every step, 300 steps:

- no failure: samples/s of 2 groups x 2 ranks (fault tolerant) vs one world of 4, L=2
  (standard), alternated ``--rounds`` times; the ratio is what counts on a shared box;
- a SIGKILL of one worker (rank 1) once step ``--kill-at`` is logged: fault tolerant (group 1
  restarts and heals, no checkpoint) vs standard (the whole world restarts from the latest
  checkpoint, every 50 steps). Reported: the survivors' stall (kill -> their next committed
  step), heal seconds and bytes, steps redone, rank-seconds lost, time to pass the kill step
  again, total wall time, eval AUC against the uninterrupted run.

Regenerate: PYTHONPATH=. .venv/bin/python bench/ft_bench.py   (~10 min on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.bench_util import RESULTS_DIR, machine_note, publish, stored_stamp  # noqa: E402
from bench.ft_report import clean_markdown, markdown, overlap_quorum_markdown  # noqa: E402
from bench.ft_workers import workers  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
COMMON = ("train.eval_batches=10", "train.progress_bar=false", "parallel.sync.divergence_every=0")
PER_STEP = ("train.log_every=1",)
"""The kill runs log every step (their analysis needs each commit's time); the no-failure
rounds keep the config's ``log_every`` (10), as a user runs it: a per-step log adds a
metrics all-reduce per step on both sides, which hid the fault-tolerant step's waits."""


PIPELINE: tuple[str, ...] = ()
"""``train.pipeline=...`` for every launch (``--pipeline``)."""

MC: tuple[str, ...] = ()
"""``model.managed_collision.*`` for every launch (``--mc``): every table managed-collision."""

SET: tuple[str, ...] = ()
"""Dotted overrides for every launch (``--set``), e.g. a larger batch: how the ratio moves
with the step's size (a supplementary section; the acceptance's is the config's own)."""


def _std(run_dir: Path, steps: int, kill: bool) -> list[str]:
    extra = ("checkpoint.every=50", "checkpoint.keep=2", "train.resume=auto", *PER_STEP)
    extra = extra if kill else ()
    return [
        "launch/local.sh",
        f"train.steps={steps}",
        f"run_dir={run_dir}",
        *COMMON,
        "parallel.sharding_group_size=2",
        "fault_tolerance.enable=false",
        *extra,
        *PIPELINE,
        *MC,
        *SET,
    ]


FT_VARIANTS: dict[str, tuple[str, ...]] = {
    "ft": (),
    "ft_every1": ("fault_tolerance.quorum_every=1",),
}
"""Keys of each fault-tolerant variant: ``ft_every1`` (``--compare-every1``: a quorum every
step, as before the lease)."""


def _ft(run_dir: Path, steps: int, variant: str = "ft", kill: bool = False) -> list[str]:
    quorum = FT_VARIANTS[variant]
    return [
        "launch/ft_local.sh",
        f"train.steps={steps}",
        f"run_dir={run_dir}",
        *COMMON[:2],
        *(PER_STEP if kill else ()),
        "fault_tolerance.timeout_s=20",
        *quorum,
        *PIPELINE,
        *MC,
        *SET,
    ]


def _steps(events: list[tuple[float, str]], prefix: str) -> list[tuple[float, int]]:
    """(time seen, step) of every stdout line ``prefix<step> ...`` (log_every=1: each commit)."""
    return [
        (t, int(line[len(prefix) :].split()[0])) for t, line in events if line.startswith(prefix)
    ]


def run(kind: str, run_dir: Path, steps: int, kill_at: int | None) -> dict:
    """One launch; with ``kill_at``, SIGKILL rank 1 (of group 1 in ft) at that step.
    ``kind``: ``std`` or a key of ``FT_VARIANTS``."""
    variant, kind = kind, "ft" if kind in FT_VARIANTS else kind
    env = dict(
        os.environ,
        PYTHON=sys.executable,
        OMP_NUM_THREADS="1",
        NPROC="2" if kind == "ft" else "4",
        NGROUPS="2",
        MAX_RESTARTS="3",
        LIGHTHOUSE_PORT="0",
    )
    env.pop("TORCHFT_LIGHTHOUSE", None)
    # the repo first, then the caller's path (a GPU machine's carried TorchRec lives there)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env["CONFIG"] = "configs/ft_tiny_cpu.yaml"  # both: the same model and data
    kill = kill_at is not None
    argv = _ft(run_dir, steps, variant, kill) if kind == "ft" else _std(run_dir, steps, kill)
    start, cpu = time.time(), _children_cpu_s()
    job = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    killed_at = kill_step = None
    prefix = "[train] replica=1 step=" if kind == "ft" else "[train] step="
    tail, events = [], []
    for line in job.stdout:  # type: ignore[union-attr]
        tail = (tail + [line])[-30:]
        events.append((time.time(), line))
        if kill_at is not None and killed_at is None and line.startswith(prefix):
            step = int(line[len(prefix) :].split()[0])
            if step >= kill_at:
                pids = workers(1, run_dir) if kind == "ft" else _std_workers(job.pid)
                os.kill(pids[1], signal.SIGKILL)
                killed_at, kill_step = time.time(), step
    job.wait()
    if job.returncode != 0:
        raise RuntimeError(f"{kind} run failed:\n{''.join(tail)}")
    out: dict = {
        "wall_s": time.time() - start,
        "cpu_s": _children_cpu_s() - cpu,
        "kill_time": killed_at,
        "kill_step": kill_step,
        "steps": {
            p: _steps(events, p)
            for p in ("[train] step=", "[train] replica=0 step=", "[train] replica=1 step=")
        },
    }
    if kind == "ft":
        for g in (0, 1):  # a group that restarted after the job ended writes no summary
            path = run_dir / f"replica_{g}" / "summary.json"
            out[f"g{g}"] = json.loads(path.read_text()) if path.exists() else None
    else:
        out["summary"] = json.loads((run_dir / "summary.json").read_text())
    return out


def _children_cpu_s() -> float:
    """User + system CPU seconds of every finished process this one waited for (a launcher
    waits for its torchrun agents, each agent for its workers)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _std_workers(agent: int) -> dict[int, int]:
    """{local rank: pid} of launch/local.sh's workers (torchrun's children's env)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
            env = dict(
                kv.split(b"=", 1)
                for kv in open(f"/proc/{entry}/environ", "rb").read().split(b"\0")
                if b"=" in kv
            )
        except OSError:
            continue
        if (
            b"sparse2d.train" in argv
            and b"torch.distributed.run" not in argv
            and b"LOCAL_RANK" in env
        ):
            found[int(env[b"LOCAL_RANK"])] = int(entry)
    return found


def analyse_ft(r: dict) -> dict:
    kill = r["kill_time"]
    g0, g1 = r["steps"]["[train] replica=0 step="], r["steps"]["[train] replica=1 step="]
    stall = min(t for t, _ in g0 if t > kill) - kill
    back = [t for t, _ in g1 if t > kill]
    if not back or r["g1"] is None:  # group 0 finished before group 1 was back
        raise RuntimeError("group 1 did not rejoin before the job ended: raise --kill-steps")
    down = min(back) - kill  # group 1: kill -> its first commit after the heal
    heal = [h for h in r["g1"]["heals"] if h["step"] > r["kill_step"]][-1]
    steps0 = [step for _, step in g0]
    redone = len(steps0) - len(set(steps0))
    ranks = r["g0"]["sharding_group_size"]
    past = min(t for t, step in g0 if step > r["kill_step"])
    return {
        "survivor_stall_s": stall,
        "group1_down_s": down,
        "heal_s": heal["seconds"],
        "heal_bytes_per_rank": heal["bytes"],
        "steps_redone": redone,
        "rank_seconds_lost": ranks * down + ranks * stall,
        "past_kill_step_s": past - kill,
        "samples_skipped": r["g0"]["samples_skipped"],
        "eval_auc": r["g0"]["eval_auc"],
        "wall_s": r["wall_s"],
        "identical": r["g0"]["state_digests"] == r["g1"]["state_digests"],
    }


def analyse_std(r: dict, world: int = 4) -> dict:
    kill, steps = r["kill_time"], r["steps"]["[train] step="]
    after = [(t, step) for t, step in steps if t > kill]
    resumed = min(step for _, step in after) - 1
    past = min(t for t, step in after if step > r["kill_step"])
    return {
        "resumed_from": resumed,
        "steps_redone": r["kill_step"] - resumed,
        "past_kill_step_s": past - kill,
        "rank_seconds_lost": world * (past - kill),
        "eval_auc": r["summary"]["eval_auc"],
        "wall_s": r["wall_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--kill-at", type=int, default=120)
    parser.add_argument(
        "--kill-steps",
        type=int,
        default=1000,
        help="steps of the two kill runs: the survivors must still be training when the "
        "killed group is back (a restart is a process start-up: 20-40 s on a loaded 2-core box)",
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--pipeline",
        default="none",
        choices=["none", "sparse_dist", "semi_sync"],
        help="train.pipeline of every launch",
    )
    parser.add_argument(
        "--mc",
        default="none",
        choices=["none", "mch", "zch"],
        help="managed-collision tables (MCH or MP-ZCH) in every launch; with --clean-only "
        "the section is ft-pipeline-mc",
    )
    parser.add_argument(
        "--clean-only",
        action="store_true",
        help="only the alternated no-failure rounds (section ft-pipeline with --pipeline)",
    )
    parser.add_argument(
        "--compare-every1",
        action="store_true",
        help="also alternate fault tolerance with a quorum every step (quorum_every=1)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a dotted override for every launch (repeatable; with --clean-only the section "
        "is ft-pipeline-set or ft-pipeline-mc-set)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-results-md", action="store_true", help="do not edit RESULTS.md")
    parser.add_argument(
        "--render-only", action="store_true", help="rewrite the section from --out/ft.json"
    )
    parser.add_argument(
        "--render-overlap-quorum",
        action="store_true",
        help="rewrite section ft-overlap-quorum from --out/ft_overlap_quorum.json (the run "
        "that retired fault_tolerance.overlap_quorum)",
    )
    args = parser.parse_args()
    if args.render_overlap_quorum:
        name, marker = "ft_overlap_quorum.json", "ft-overlap-quorum"
        res = json.loads((args.out / name).read_text())
        text = overlap_quorum_markdown(res)
        publish(args, res, text, name, marker, stored_stamp(marker, args.out))
        return
    # with --set: a supplementary section, not the config's own
    section = {
        (False, False): "ft-pipeline",
        (True, False): "ft-pipeline-mc",
        (False, True): "ft-pipeline-set",
        (True, True): "ft-pipeline-mc-set",
    }[(args.mc != "none", bool(args.set))]
    clean_json = f"{section.replace('-', '_')}.json"  # the --clean-only rounds' results
    if args.render_only:
        name = clean_json if args.clean_only else "ft.json"
        res = json.loads((args.out / name).read_text())
        args.machine = res["machine"]
        # the measured run's shape, not this command line's
        args.steps, args.rounds = res.get("steps", args.steps), res.get("rounds", args.rounds)
        marker = section if args.clean_only else "ft"
        text = clean_markdown(res, args) if args.clean_only else markdown(res, args)
        publish(args, res, text, name, marker, stored_stamp(marker, args.out))
        return
    global PIPELINE, MC, SET
    SET = tuple(args.set)
    PIPELINE = () if args.pipeline == "none" else (f"train.pipeline={args.pipeline}",)
    if args.mc != "none":
        MC = ("model.managed_collision.enabled=true", f"model.managed_collision.kind={args.mc}")
    load = os.getloadavg()[0]
    kinds = (
        "ft",
        *(("ft_every1",) if args.compare_every1 else ()),
        "std",
    )
    res: dict = {
        "clean": {kind: [] for kind in kinds},
        "pipeline": args.pipeline,
        "mc": args.mc,
        "steps": args.steps,
        "rounds": args.rounds,
        "set": list(SET),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):  # alternate the variants: the box is shared
            # ... and reverse their order every other round (ABBA): the first launch after
            # other work runs slowest, so a fixed order favours whoever runs second
            for kind in kinds if i % 2 == 0 else kinds[::-1]:
                r = run(kind, Path(tmp) / f"{kind}{i}", args.steps, None)
                summary = r["summary"] if kind == "std" else r["g0"]
                sps, auc = summary["samples_per_s"], summary["eval_auc"]
                entry = {
                    "samples_per_s": sps,
                    "eval_auc": auc,
                    "wall_s": r["wall_s"],
                    "cpu_s": r["cpu_s"],
                }
                if kind != "std":  # main-thread ms per step blocked on the quorum / the vote
                    for key in ("quorum_wait_s", "vote_wait_s", "echo_wait_s"):
                        entry[f"{key[:-2]}_ms_per_step"] = 1e3 * summary[key] / args.steps
                    entry["quorums"] = summary["quorums"]
                res["clean"][kind].append(entry)
                print(kind, res["clean"][kind][-1], flush=True)
        if args.clean_only:
            args.machine = res["machine"] = machine_note(load)
            publish(args, res, clean_markdown(res, args), clean_json, section)
            return
        clean = run("ft", Path(tmp) / "ftclean", args.kill_steps, None)
        res["clean_long_ft_auc"] = clean["g0"]["eval_auc"]
        res["kill_ft"] = analyse_ft(run("ft", Path(tmp) / "ftkill", args.kill_steps, args.kill_at))
        print(res["kill_ft"], flush=True)
        std = run("std", Path(tmp) / "stdkill", args.kill_steps, args.kill_at)
        res["kill_std"] = analyse_std(std)
    args.machine = res["machine"] = machine_note(load)
    publish(args, res, markdown(res, args), "ft.json", "ft")


if __name__ == "__main__":
    main()
