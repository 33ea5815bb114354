"""Two commits of sparse2d on the same job, rounds alternating in one run: before vs after.

A redesign must leave the shipped jobs' speed where it was. Each commit is exported
(``git archive``) into a folder of its own and run from there (its ``sparse2d`` first on the
path, the same interpreter and packages for both), alternating which runs first in each round
so the machine's load hits both alike. Jobs:

- ``flat``: the main job (``configs/tiny_cpu.yaml``, 4 gloo CPU processes) through
  ``torch.distributed.run``, as ``make train`` runs it;
- ``cluster``: ``make train-cluster``'s job (``configs/cluster_cpu.yaml`` on 2 emulated hosts x 4
  ranks at 200 Mbit/s, ``launch/emulated_hosts.sh``; needs root).

Run: ``PYTHONPATH=. .venv/bin/python bench/checkout_ab.py --job flat --before 69b35bf --after HEAD``.
Writes ``bench/results/checkout_ab_<job>.json`` and the ``checkout-ab-<job>`` section of
``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_util import RESULTS_DIR, publish, stored_stamp, timed

ROOT = Path(__file__).resolve().parents[1]
JOBS = {
    "flat": "configs/tiny_cpu.yaml",
    "cluster": "configs/cluster_cpu.yaml",
}
MARKERS = {
    "flat": "checkout-ab-flat",
    "cluster": "checkout-ab-cluster",
    "flat-stream": "checkout-ab-flat-stream",
    "flat-redesign": "checkout-ab-flat-redesign",
    "cluster-redesign": "checkout-ab-cluster-redesign",
}
"""Each job's section of bench/RESULTS.md, and each tagged comparison's (``JOB-TAG``)."""
KEEP = ("samples_per_s", "sync_s_per_step", "eval_auc", "sharding_group_size")


def export(rev: str, into: Path) -> str:
    """``rev``'s tree in ``into``; returns its full commit id."""
    commit = subprocess.run(
        ["git", "rev-parse", rev], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return commit


def run(tree: Path, job: str, steps: int, run_dir: Path, timeout: float) -> dict[str, Any]:
    """One run of ``job`` from ``tree``; the summary's figures."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    common = [f"train.steps={steps}", "train.progress_bar=false", f"run_dir={run_dir}"]
    if job == "flat":
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=4",
            "-m",
            "sparse2d.train",
            "--config",
            JOBS[job],
            *common,
            "train.eval_every=0",
        ]
    else:
        env.update(
            HOSTS="2",
            NPROC="4",
            LINK="200mbit",
            CONFIG=JOBS[job],
            PYTHON=sys.executable,
            HOST_RESTARTS="0",
            MAX_RESTARTS="0",
        )
        command = ["bash", "launch/emulated_hosts.sh", *common]
    shutil.rmtree(run_dir, ignore_errors=True)
    done = subprocess.run(
        command, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout
    )
    summary = run_dir / "summary.json"
    if done.returncode or not summary.exists():
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"{job} from {tree.name} failed ({done.returncode}): {tail}")
    data = json.loads(summary.read_text())
    return {k: data.get(k) for k in KEEP}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {name: Path(tmp) / name for name in runs}
        commits = {
            name: export(rev, trees[name])
            for name, rev in (("before", args.before), ("after", args.after))
        }
        for r in range(args.rounds):
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            for name in order:
                begin = time.perf_counter()
                out = run(
                    trees[name], args.job, args.steps, Path(tmp) / f"run_{name}_{r}", args.timeout
                )
                out.update(round=r, wall_s=time.perf_counter() - begin, load=os.getloadavg()[0])
                runs[name].append(out)
                print(f"round {r} {name}: {out['samples_per_s']:.0f} samples/s", flush=True)
    return {
        "job": args.job,
        "tag": args.tag,
        "config": JOBS[args.job],
        "steps": args.steps,
        "commits": commits,
        "runs": runs,
    }


def render(result: dict[str, Any]) -> str:
    mean = {n: sum(x["samples_per_s"] for x in r) / len(r) for n, r in result["runs"].items()}
    rows = "".join(
        f"| {b['round']} | {b['samples_per_s']:,.0f} | {a['samples_per_s']:,.0f} |\n"
        for b, a in zip(result["runs"]["before"], result["runs"]["after"], strict=True)
    )
    c = result["commits"]
    tag = result.get("tag", "")
    stem = stored_name(result["job"], tag)
    return (
        f"## Before/after a change{f' ({tag})' if tag else ''}, {result['job']} job "
        "(bench/checkout_ab.py)\n\n"
        f"`{result['config']}`, {result['steps']} steps per run, rounds alternating which "
        f"commit runs first; before = `{c['before'][:7]}`, after = `{c['after'][:7]}`. "
        f"Stored: `bench/results/{stem}.json`. Rerun: `PYTHONPATH=. "
        f".venv/bin/python bench/checkout_ab.py --job {result['job']} --before "
        f"{c['before'][:7]} --after {c['after'][:7]}{f' --tag {tag}' if tag else ''}`.\n\n"
        "| round | before (samples/s) | after (samples/s) |\n|---:|---:|---:|\n"
        f"{rows}| mean | {mean['before']:,.0f} | {mean['after']:,.0f} |\n\n"
        f"After / before: **{mean['after'] / mean['before']:.3f}** (mean of the rounds).\n"
    )


def stored_name(job: str, tag: str) -> str:
    """The stored JSON's stem (and, with ``-``, the RESULTS.md marker) of a job's run: one per
    ``--tag``, so a later comparison never overwrites an earlier one's evidence."""
    return f"checkout_ab_{job}" + (f"_{tag}" if tag else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", choices=sorted(JOBS), default="flat")
    parser.add_argument("--before", required=True, help="a git revision")
    parser.add_argument("--after", default="HEAD", help="a git revision")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-results-md", action="store_true")
    parser.add_argument("--render", action="store_true", help="re-render the stored JSON")
    parser.add_argument(
        "--tag", default="", help="what the change is (a word): its own JSON and section"
    )
    args = parser.parse_args(argv)
    stem = stored_name(args.job, args.tag)
    name = f"{stem}.json"
    key = f"{args.job}-{args.tag}" if args.tag else args.job
    if key not in MARKERS:
        parser.error(
            f"--tag {args.tag!r} has no section for --job {args.job}: add {key!r} to MARKERS"
        )
    marker = MARKERS[key]
    if args.render:
        result = json.loads((args.out / name).read_text())
        stamp = stored_stamp(marker, args.out)
    else:
        result, _ = timed(args, measure, args)
        stamp = None
    publish(args, result, render(result), name, marker, stamp)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
