"""Record a GPU machine's CUDA check (bench/gpu/check.sh) in bench/RESULTS.md.

The logs that ``check.sh`` leaves in ``$OUT`` come back from the device machine; this script
reads them (each ``--run`` one call's folder), keeps what they say in
``bench/results/cuda_check.json`` and writes the ``cuda-check`` section. ``FINDINGS`` holds
what each failure was and the commit that fixed it: the logs show the failure, not the fix.
Usage: ``python bench/cuda_check.py --run LOGDIR [--run LOGDIR ...]``; ``--render`` rewrites
the section from the saved JSON.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from bench.bench_util import write_section

OUT = Path(__file__).parent / "results" / "cuda_check.json"

FINDINGS = [
    (
        "trainer and every model build: `AttributeError: HashZchManagedCollisionModule has no "
        "attribute '_zero_collision_hash'` (TorchRec 1.6 lacks the callable one patch wraps)",
        "6db3b97: `apply_all` skips, with a warning, a patch whose upstream callable is "
        "missing (`Patch.sites_present`)",
    ),
    (
        "2D-vs-1D tests printed nothing in 200 s, no stack. Ranks were forked from a "
        "forkserver that had imported FBGEMM's CUDA build (such a fork may not use the GPU), "
        "and a rank that died while joining kept the harness waiting 300 s",
        "6db3b97: spawned ranks on CUDA; a rank that dies while joining fails the start at "
        "once. The second machine (spawned ranks) still hung: next row",
    ),
    (
        "trainer on CUDA + NCCL built the model and trained to its first log line, then "
        "`RuntimeError: No backend type associated with device type cpu` (`max_over_ranks` "
        "all-reduced a CPU tensor on an NCCL-only group)",
        "db061fb, 6f41771: flags, votes, metrics and the eval gather go on `flag_device(pg)` (the "
        "GPU on an NCCL-only group); not yet rerun on a GPU",
    ),
    (
        "2D-vs-1D tests, second machine: the first two checks hung (50 s each, per-test limit), "
        "cause not seen: no stack was printed",
        "db061fb: a hung check now prints every hung rank's stack (SIGUSR1) and "
        "`SPARSE2D_TEST_CHECK_S` bounds it; the next GPU check reads them. Open",
    ),
]
"""(what the log shows, what fixed it). Append on each GPU check."""


def parse_run(folder: Path) -> dict[str, Any]:
    """What one call's logs say: versions and collectives (smoke), test outcomes, trainer."""
    run: dict[str, Any] = {"folder": folder.name}
    smoke = folder / "smoke.log"
    if smoke.exists():
        lines = [x for x in smoke.read_text().splitlines() if x.startswith("{")]
        run["smoke"] = json.loads(lines[-1]) if lines else None
    eq = folder / "equivalence.log"
    if eq.exists():
        text = eq.read_text()
        summary = re.findall(r"=+ (.*(?:passed|failed|error).*) in [\d.]+s", text)
        run["equivalence"] = {
            "summary": summary[-1] if summary else "no summary (killed by the step's time limit)",
            "progress": "".join(re.findall(r"^([.FEsx]+)(?:\s|$)", text, re.M))
            or re.sub(r"[^.FEsx]", "", text.split("WARNING")[0])[:40],
            "timeouts": len(re.findall(r"Timeout", text)),
        }
    for log in sorted(folder.glob("train_*.log")):
        text = log.read_text()
        start = re.search(r"^\[start\] (.*)$", text, re.M)
        final = re.search(r"^final (.*)$", text, re.M)
        error = re.search(r"^sparse2d\.train: rank \d+: (.*)$", text, re.M)
        steps = re.findall(r"^\[train\] step=(\d+)", text, re.M)
        run[log.stem] = {
            "start": start.group(1)[:400] if start else None,
            "final": final.group(1) if final else None,
            "error": error.group(1) if error else None,
            "last_logged_step": int(steps[-1]) if steps else None,
        }
    return run


def render(data: dict[str, Any]) -> str:
    smoke = next((r["smoke"] for r in data["runs"] if r.get("smoke")), None)
    lines = [
        "## CUDA check on a lent GPU machine (bench/cuda_check.py, bench/gpu/check.sh)",
        "",
        "The first run of the CUDA path. One H100 with torch 2.11 (cu130) and no network: "
        "FBGEMM 1.6.0 (the release for torch 2.11; its sm_80/sm_100 cubins zeroed so it fits "
        "a 64 MiB call, `bench/gpu/prune_fatbin.py`), TorchRec 1.6.1 and torchft 0.2.0 were "
        "carried in (`bench/gpu/wheels.sh`). TorchRec 1.6 is older than the 1.8/1.9 sets "
        "sparse2d is tested on. NCCL refuses two ranks on one GPU, so the multi-rank tests "
        "move CUDA tensors over gloo (`SPARSE2D_TEST_DEVICE=cuda`), and the trainer ran "
        "CUDA + NCCL as one process.",
        "",
    ]
    if smoke:
        versions = ", ".join(
            f"{k} {smoke[k]}"
            for k in ("gpu", "torch", "cuda", "nccl", "fbgemm_gpu", "torchrec", "python")
        )
        ok = [k for k, v in smoke["gloo_on_cuda"].items() if v == "ok"]
        lines += [
            f"- Machine: {versions}.",
            f"- FBGEMM CUDA op `asynchronous_complete_cumsum`: {smoke['fbgemm_cumsum']}.",
            f"- gloo on CUDA tensors, 2 ranks on one GPU: {', '.join(ok)} ok"
            + "".join(f"; {k}: {v}" for k, v in smoke["gloo_on_cuda"].items() if v != "ok")
            + ".",
        ]
    lines += ["", "| call | step | outcome |", "|---|---|---|"]
    for number, run in enumerate(data["runs"], 1):
        run = {**run, "folder": f"machine {number}"}
        if eq := run.get("equivalence"):
            outcome = f"{eq['summary']}; progress `{eq['progress'] or '-'}`"
            lines.append(f"| {run['folder']} | 2D vs 1D (tests/test_collection.py) | {outcome} |")
        for key in sorted(k for k in run if k.startswith("train_")):
            t = run[key]
            outcome = f"ran: {t['final']}" if t["final"] else f"failed: `{t['error']}`"
            lines.append(f"| {run['folder']} | trainer, {key[6:]} | {outcome} |")
    lines += ["", "| what the log shows | fix |", "|---|---|"]
    lines += [f"| {seen} | {fix} |" for seen, fix in data["findings"]]
    lines += [
        "",
        "No throughput or equivalence number on CUDA yet: every step above stopped on a bug "
        "before it measured. Device time: 15 min per session (two machine starts, two calls "
        "each: the FBGEMM build travels in two 64 MiB parts).",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, action="append", default=[])
    parser.add_argument("--render", action="store_true", help="from the saved JSON")
    args = parser.parse_args()
    if args.render:
        data = json.loads(OUT.read_text())
    else:
        data = {"runs": [parse_run(folder) for folder in args.run], "findings": FINDINGS}
        OUT.write_text(json.dumps(data, indent=1))
    text = render(data)
    print(text)
    stamp = {
        "sparse2d": "0.1.0",
        "git_commit": None,
        **{k: (data["runs"][0].get("smoke") or {}).get(k) for k in ("torch", "torchrec")},
        "fbgemm_gpu": (data["runs"][0].get("smoke") or {}).get("fbgemm_gpu"),
        "backend": "nccl (1 rank) / gloo on CUDA (2-4 ranks)",
        "device_type": "cuda",
        "hosts": 1,
    }
    write_section(text, "cuda-check", stamp=stamp)


if __name__ == "__main__":
    main()
