"""The README's test command from a fresh clone, timed: install + lint + the whole suite.

Each run clones this repository's HEAD into a new temporary directory and runs
``bash .ci/run`` there (= ``make test``: a new ``.venv``, pip from its cache, ruff, every
test, slow ones included), with ``SPARSE2D_THREAD_LOG`` set so the suite's thread sampler
(``tests/conftest.py``) records the peak thread count of the shared test workers. The
machine's load average is recorded before and after each run: absolute minutes mean
little on a shared 2-core box.

    PYTHONPATH=. python bench/suite_bench.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from bench_util import write_section

ROOT = Path(__file__).resolve().parent.parent
LOG_DIR: Path | None = None


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:9]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


class BusySampler:
    """Share of all cores' time spent busy while a run lasts: the suite is CPU-bound when
    this is near 100% (then only fewer CPU seconds make it faster, not more parallelism)."""

    def __init__(self) -> None:
        self.start = _cpu_times()

    def stop(self) -> float:
        end = _cpu_times()
        return (end[0] - self.start[0]) / max(end[1] - self.start[1], 1)


def one_run(index: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="sparse2d-suite-") as tmp:
        clone = Path(tmp) / "sparse2d"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True
        ).stdout.strip()
        threads = Path(tmp) / "threads.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
        env.update(CI="true", SPARSE2D_THREAD_LOG=str(threads))
        load_before = os.getloadavg()[0]
        busy = BusySampler()
        start = time.monotonic()
        run = subprocess.run(
            ["bash", ".ci/run"], cwd=clone, env=env, capture_output=True, text=True, check=False
        )
        seconds = time.monotonic() - start
        cores_busy = busy.stop()
        load_after = os.getloadavg()[0]
        out = run.stdout + run.stderr
        if LOG_DIR is not None:  # the whole output, to see what failed
            (LOG_DIR / f"suite_run{index}.log").write_text(out)
        summary = [line for line in out.splitlines() if re.search(r"\d+ passed", line)]
        tests = re.search(r"in ([\d.]+)s", summary[-1]) if summary else None
        peak = json.loads(threads.read_text()) if threads.exists() else {}
        return {
            "run": index,
            "commit": commit,
            "returncode": run.returncode,
            "total_s": round(seconds, 1),
            "pytest_s": float(tests.group(1)) if tests else None,
            "summary": summary[-1].strip("= ") if summary else out[-2000:],
            "load_before": round(load_before, 2),
            "load_after": round(load_after, 2),
            "cores_busy": round(cores_busy, 3),
            "peak_worker_threads": peak.get("peak_threads"),
            "thread_samples": peak.get("samples"),
        }


def markdown(runs: list[dict]) -> str:
    rows = "\n".join(
        f"| {r['run']} | `{r['commit']}` | {r['total_s'] / 60:.1f} min ({r['total_s']:.0f} s) | "
        f"{r['pytest_s']} s | {r['summary']} | {r['load_before']} -> {r['load_after']} | "
        f"{_busy(r)} | {r['peak_worker_threads']} ({r['thread_samples']} samples) | "
        f"{r['returncode']} |"
        for r in runs
    )
    return f"""## Test suite: `make test` from a fresh clone (bench/suite_bench.py)

Each run clones the repository at the commit shown, then `bash .ci/run` (= `make test`:
new `.venv`, install, ruff, the whole suite with the slow tests, its modules on two
pytest-xdist workers). {os.cpu_count()} cores. Cores busy: the share of all cores' time spent
busy during the run (/proc/stat; near 100% means CPU-bound). Peak threads: the most any
shared test worker held at a sample (every 0.5 s).

| run | commit | with install | pytest | result | load avg before -> after | cores busy | peak worker threads | exit |
|---|---|---|---|---|---|---|---|---|
{rows}

Regenerate: `PYTHONPATH=. .venv/bin/python bench/suite_bench.py --runs 3`.
"""


def _busy(run: dict) -> str:
    return f"{run['cores_busy'] * 100:.0f}%" if run.get("cores_busy") is not None else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-results-md", action="store_true")
    parser.add_argument(
        "--keep", type=Path, help="earlier runs (a suite.json) to list before the new ones"
    )
    parser.add_argument("--log-dir", type=Path, help="keep each run's whole output there")
    args = parser.parse_args()
    global LOG_DIR
    LOG_DIR = args.log_dir
    if LOG_DIR is not None:  # before the first 30-minute run, not after it
        LOG_DIR.mkdir(parents=True, exist_ok=True)
    runs = json.loads(args.keep.read_text()) if args.keep else []
    for index in range(len(runs) + 1, len(runs) + args.runs + 1):
        runs.append(one_run(index))
        print(json.dumps(runs[-1]), flush=True)
    (ROOT / "bench" / "results" / "suite.json").write_text(json.dumps(runs, indent=1))
    text = markdown(runs)
    print(text)
    if not args.no_results_md:
        write_section(text, "suite")


if __name__ == "__main__":
    main()
