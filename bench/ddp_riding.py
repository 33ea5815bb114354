"""The evidence that retired riding DDP's all-reduce: the stored run, rendered.

Until issue 66 a cadence sync ran inside DDP's backward, its NaN/inf vote carried in DDP's last
gradient bucket (small syncs folded their values into it too). The issue kept that second path
only if an end-to-end run showed it winning at least 5% of samples/s on the flat main job. The
run (``bench/results/ddp_riding.json``, its command inside) was made at commit 69b35bf, the last
with the code: the same trainer with the carrier (riding) and with its comm-hook patch opted out
(every sync after the step). The code is gone, so this script cannot measure again; it renders
the stored run into the ``ddp-riding`` section of ``bench/RESULTS.md``.

Run: ``PYTHONPATH=. .venv/bin/python bench/ddp_riding.py``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench_util import RESULTS_DIR, publish, stored_stamp

MARKER = "ddp-riding"
RIDING, AFTER = "riding DDP", "after the step"


def render(result: dict[str, Any]) -> str:
    by = {
        name: [r["samples_per_s"] for r in result["runs"] if r["setting"] == name]
        for name in (RIDING, AFTER)
    }
    mean = {name: sum(v) / len(v) for name, v in by.items()}
    rows = "".join(
        f"| {i} | {a:,.0f} | {b:,.0f} |\n"
        for i, (a, b) in enumerate(zip(*by.values(), strict=True))
    )
    ratio = mean[RIDING] / mean[AFTER]
    return (
        "## DDP riding: a sync inside DDP's backward vs after the step (retired)\n\n"
        f"`bench/ddp_riding.py` renders the stored run, `bench/results/ddp_riding.json`: "
        f"{result['what']}. Measured at commit {result['commit']}, before the code was "
        f"removed (the command is in the JSON); {result['machine_note']}.\n\n"
        "| round | riding DDP (samples/s) | after the step (samples/s) |\n|---:|---:|---:|\n"
        f"{rows}| mean | {mean[RIDING]:,.0f} | {mean[AFTER]:,.0f} |\n\n"
        f"Riding DDP / after the step: **{ratio:.3f}** (mean of the rounds). Issue 66 kept "
        "riding only if it won at least 5% on this job: it did not, so the carried vote, the "
        "folds and the DDP comm-hook patch were removed; every sync runs after the step through "
        "one spine (`sparse2d/sync/policy.py`).\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-results-md", action="store_true")
    args = parser.parse_args(argv)
    result = json.loads((args.out / "ddp_riding.json").read_text())
    publish(args, result, render(result), "ddp_riding.json", MARKER, stored_stamp(MARKER, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
