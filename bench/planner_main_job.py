"""The issue's second known failure, measured: the shipped main job (``configs/tiny_cpu.yaml``,
world 4) at every L, trainer samples/s, alternating L within each round.

Usage: ``PYTHONPATH=. .venv/bin/python bench/planner_main_job.py [--steps 200] [--rounds 2]``;
writes ``bench/inputs/planner_main_job.json`` (read by ``planner_calibration.py --holdout``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from main_job_bench import run_trainer

HERE = os.path.dirname(os.path.abspath(__file__))
SAVED = os.path.join(HERE, "inputs", "planner_main_job.json")
GROUP_SIZES = (1, 2, 4)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    out: dict[str, list[float]] = {str(L): [] for L in GROUP_SIZES}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = GROUP_SIZES if r % 2 == 0 else tuple(reversed(GROUP_SIZES))
            for L in order:
                summary = run_trainer(
                    [f"parallel.sharding_group_size={L}"], args.steps, os.path.join(tmp, f"{r}_{L}")
                )
                out[str(L)].append(summary["samples_per_s"])
                print(L, summary["samples_per_s"], flush=True)
    loads.append(os.getloadavg()[0])
    with open(SAVED, "w") as f:
        json.dump({"samples_per_s": out, "load": loads, "steps": args.steps}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
