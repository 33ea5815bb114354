"""Seconds of ``sparse2d plan --json`` at scale: the advisor plans every candidate ``L``.

Runs ``python -m sparse2d.train.advisor_command --config C --world-size N --json`` in a
fresh process, ``--repeat`` times per variant (best wall time kept), with ``--jobs 1`` and
with the default ``--jobs``, and optionally the same command on another git ref
(``--before REF``: its ``sparse2d/`` and ``configs/`` exported to a temporary directory, run
from there) so the speed-up is
measured on the same machine in the same minutes. Every run gets ``PYTHONHASHSEED=0``:
TorchRec orders equally rated sharding types by Python's string hash, so the labels of a
few candidates (table-wise vs a one-shard column-wise) vary with it and nothing else does.
Writes the ``advisor_speed`` section of bench/RESULTS.md.

    python bench/advisor_speed.py [--world-size 4096] [--repeat 2] [--before 09003e9] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
CONFIG = "configs/dlrm_large_1024gpu.yaml"


def run_plan(source: str, world: int, jobs: int | None) -> dict:
    """One ``sparse2d plan --json`` with ``source`` first on the path: wall and CPU seconds
    (the child's user + system time) and the advice."""
    cmd = [sys.executable, "-m", "sparse2d.train.advisor_command", "--config", CONFIG]
    cmd += ["--world-size", str(world), "--json"]
    if jobs is not None:
        cmd += ["--jobs", str(jobs)]
    env = {**os.environ, "PYTHONPATH": source, "PYTHONHASHSEED": "0"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()  # cwd: ``-m`` puts it first on the path, before PYTHONPATH
    done = subprocess.run(cmd, cwd=source, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    advice = json.loads(done.stdout)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "advice": advice}


def export_ref(ref: str, into: str) -> str:
    """``ref``'s ``sparse2d/`` package and ``configs/`` in ``into`` (git archive), for
    ``run_plan``."""
    archive = subprocess.run(
        ["git", "archive", ref, "sparse2d", "configs"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return into


def measure(args: argparse.Namespace) -> dict:
    from bench_util import machine_note

    from sparse2d.train.advisor_command import default_jobs

    load = os.getloadavg()[0]
    variants: list[tuple[str, str, int | None]] = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.before:
            variants.append((f"{args.before} (before)", export_ref(args.before, tmp), None))
        variants.append(("this tree, --jobs 1", ROOT, 1))
        if default_jobs() > 1:
            variants.append((f"this tree, --jobs {default_jobs()} (default)", ROOT, None))
        rows = []
        for name, source, jobs in variants:
            runs = [run_plan(source, args.world_size, jobs) for _ in range(args.repeat)]
            best = min(runs, key=lambda r: r["wall_s"])
            advice = best["advice"]
            rows.append(
                {
                    "variant": name,
                    "walls": [round(r["wall_s"], 1) for r in runs],
                    "best_wall_s": best["wall_s"],
                    "cpu_s": best["cpu_s"],
                    "recommended": advice["recommended"],
                    "layout": advice["recommended_layout"],
                    "steps_ms": {
                        c["sharding_group_size"]: round(c["step_s"] * 1e3, 3)
                        for c in advice["candidates"]
                    },
                }
            )
    return {"world_size": args.world_size, "rows": rows, "machine": machine_note(load)}


def render(result: dict) -> str:
    world = result["world_size"]
    lines = [
        f"## Group-size advisor: seconds of `sparse2d plan --json` at {world:,} ranks "
        "(bench/advisor_speed.py)",
        "",
        f"`sparse2d plan --config {CONFIG} --world-size {world} --json`, each run a fresh "
        "process with `PYTHONHASHSEED=0`; the advisor plans every divisor L with the "
        "launch's planner (TorchRec's enumerator, estimators and partitioner on a meta "
        f"model). Machine: {result['machine']} (a shared box: seconds are upper bounds). "
        "'CPU s' is the command's user + system time over all its processes.",
        "",
        "| variant | wall s (each run) | best wall s | CPU s | recommended L | same step "
        "estimates as the first row |",
        "|---|---|---:|---:|---:|---|",
    ]
    first = result["rows"][0]["steps_ms"]
    for row in result["rows"]:
        same = "yes" if row["steps_ms"] == first else "NO"
        lines.append(
            f"| {row['variant']} | {', '.join(map(str, row['walls']))} | "
            f"{row['best_wall_s']:.1f} | {row['cpu_s']:.1f} | {row['recommended']} "
            f"({row['layout']}) | {same} |"
        )
    lines += [
        "",
        "Reproduce: `.venv/bin/python bench/advisor_speed.py --world-size "
        f"{world} --before REF` (REF: a git ref to compare with).",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--world-size", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=2, help="runs per variant (best kept)")
    parser.add_argument("--before", help="a git ref to measure first (e.g. 09003e9)")
    parser.add_argument("--no-write", action="store_true", help="print, do not write RESULTS.md")
    args = parser.parse_args()
    result = measure(args)
    text = render(result)
    print(text)
    if not args.no_write:
        from bench_util import write_section

        write_section(text, "advisor_speed")


if __name__ == "__main__":
    main()
