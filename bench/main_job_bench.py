"""The main job, 2D vs 1D: samples/s of ``configs/tiny_cpu.yaml`` through the real trainer.

Each run is the trainer as users launch it (``torch.distributed.run``, 4 gloo
processes, same global batch and data), ``--steps`` steps, no periodic eval.
Runs alternate between the settings, ``--rounds`` times, so machine load hits
them alike; the table reports the best and every round. Goal: 2D (L=2, sync
every step, default engine) >= 1D (L=4).

Run: ``.venv/bin/python bench/main_job_bench.py`` (about 7 minutes on 2 cores).
Writes the ``main-job`` section of ``bench/RESULTS.md`` and ``bench/results/main_job.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_util import RESULTS_DIR, publish, timed

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SETTINGS = {
    "1D (L=4)": ["parallel.sharding_group_size=4"],
    "2D (L=2, default: engine auto, hide)": [],
    "2D (L=2, engine dense, hide)": ["parallel.sync.engine=dense"],
    "2D (L=2, engine sparse, hide)": ["parallel.sync.engine=sparse"],
    "2D (L=2, default, NaN/inf guard off)": ["parallel.sync.check_finite=false"],
}
"""The first two are the acceptance pair; the fixed engines check auto against the better
one on the main job (the touched-rows engine cost twice the dense one there, issue 11); the
guard-off run prices the NaN/inf guard. Syncs riding DDP's all-reduce were retired by
measurement (bench/RESULTS.md, ddp-riding); this bench's stored rows before that date were
measured with them."""


def run_trainer(
    overrides: list[str],
    steps: int,
    run_dir: str,
    nproc: int = 4,
    env: dict[str, str] | None = None,
    config: str | os.PathLike[str] = ROOT / "configs" / "tiny_cpu.yaml",
) -> dict[str, Any]:
    """One trainer run of ``config`` (default the main job's); returns its ``summary.json``."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "sparse2d.train",
        "--config",
        str(config),
        f"train.steps={steps}",
        "train.eval_every=0",
        "train.eval_batches=1",
        "train.progress_bar=false",
        f"run_dir={run_dir}",
        *overrides,
    ]
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **(env or {}))
    done = subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"trainer failed ({done.returncode}): {done.stderr[-3000:]}")
    return json.loads((Path(run_dir) / "summary.json").read_text())


def measure(
    settings: dict[str, list[str]],
    steps: int,
    rounds: int,
    runner: Callable[..., dict[str, Any]] = run_trainer,
) -> dict[str, list[dict]]:
    """``rounds`` runs per setting, alternating their order; ``runner`` launches one run
    (the test's smoke run passes one that reuses its live gloo world)."""
    out: dict[str, list[dict]] = {name: [] for name in settings}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            names = list(settings) if r % 2 == 0 else list(reversed(settings))
            for i, name in enumerate(names):
                run_dir = os.path.join(tmp, f"{r}_{i}")
                summary = runner(settings[name], steps, run_dir)
                out[name].append(
                    {
                        k: summary[k]
                        for k in (
                            "samples_per_s",
                            "sync_s_per_step",
                            "sync_bytes_per_step",
                            "sync_modes",
                        )
                    }
                )
    return out


def _markdown(results: dict[str, list[dict]], args: argparse.Namespace, wall: float) -> str:
    lines = [
        "## Main job: 2D vs 1D samples/s (bench/main_job_bench.py)",
        "",
        f"`configs/tiny_cpu.yaml` through the trainer (`torch.distributed.run`, 4 gloo CPU "
        f"processes, global batch 512), {args.steps} steps per run, {args.rounds} rounds "
        f"alternating the settings' order; {args.machine}. Wall {wall:.0f} s.",
        "",
        "| setting | best samples/s | every round | sync ms/step (best run) | sync KB/step "
        "| syncs dense / sparse (best run) |",
        "|---|---:|---|---:|---:|---|",
    ]
    for name, runs in results.items():
        best = max(runs, key=lambda x: x["samples_per_s"])
        rounds = ", ".join(f"{x['samples_per_s']:.0f}" for x in runs)
        modes = best["sync_modes"]
        lines.append(
            f"| {name} | {best['samples_per_s']:.0f} | {rounds} | "
            f"{1e3 * best['sync_s_per_step']:.2f} | {best['sync_bytes_per_step'] / 1e3:.1f} | "
            f"{modes.get('dense', 0)} / {modes.get('sparse', 0)} |"
        )
    names = list(results)
    best = {n: max(x["samples_per_s"] for x in results[n]) for n in names}
    lines += [
        "",
        f"2D (default) / 1D, best of {args.rounds}: **{best[names[1]] / best[names[0]]:.3f}** "
        f"(goal >= 1.0).",
    ]
    unguarded = [n for n in names if "guard off" in n]
    if unguarded:
        lines.append(
            f"2D with the NaN/inf guard off / 1D, best of {args.rounds}: "
            f"**{best[unguarded[0]] / best[names[0]]:.3f}**."
        )
    engines = [n for n in names if "engine dense" in n or "engine sparse" in n]
    if engines:
        fixed = max(best[n] for n in engines)
        lines.append(
            f"Default (auto) / the better fixed engine, best samples/s: "
            f"**{best[names[1]] / fixed:.3f}** (goal >= 0.95)."
        )
    lines += [
        "",
        f"Reproduce: `PYTHONPATH=. .venv/bin/python bench/main_job_bench.py --steps {args.steps} "
        f"--rounds {args.rounds}`.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-results-md", action="store_true", help="do not edit RESULTS.md")
    args = parser.parse_args()
    results, wall = timed(args, measure, SETTINGS, args.steps, args.rounds)
    publish(args, results, _markdown(results, args, wall), "main_job.json", "main-job")


if __name__ == "__main__":
    main()
