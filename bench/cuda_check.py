"""Record a GPU machine's CUDA check (bench/gpu/check.sh) in bench/RESULTS.md.

The logs that ``check.sh`` leaves in ``$OUT`` come back from the device machine; this script
reads them (each ``--run`` one call's folder), appends them as one GPU session to
``bench/results/cuda_check.json`` (earlier sessions stay) and writes the ``cuda-check``
section. ``FINDINGS`` holds what each failure was and the commit that fixed it: the logs show
the failure, not the fix. Usage: ``python bench/cuda_check.py --session LABEL --run LOGDIR
[--run LOGDIR ...]``; ``--render`` rewrites the section from the saved JSON.
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
        "GPU on an NCCL-only group). The second session's trainer ran 300 steps on CUDA + NCCL",
    ),
    (
        "2D-vs-1D tests, second machine: the first two checks hung (50 s each, per-test limit), "
        "cause not seen: no stack was printed",
        "db061fb: a hung check now prints every hung rank's stack (SIGUSR1) and "
        "`SPARSE2D_TEST_CHECK_S` bounds it; the second session read them: next row",
    ),
    (
        "2D-vs-1D hang, second session (stacks and rank errors printed): ranks 1-3 raised "
        "`ValueError: Local shard tensor device does not match with local Shard's placement! "
        "Found local shard tensor device: cuda:0, local shard metadata placement device: "
        "cuda:2` in the 1D reference (TorchRec's planner places rank r on cuda:r; here 4 "
        "ranks share one GPU), while rank 0 waited in DDP's parameter check",
        "33cc226: the test's 1D reference puts its placements on the GPUs there are "
        "(`remap_plan`, as the 2D model does). Then all 14 2D-vs-1D checks passed on CUDA",
    ),
    (
        "MC tests (tests/test_sync_mc.py) on TorchRec 1.6.1: `ProcessGroupGloo::allgather: "
        "invalid output tensor list (expected length 4, got 2)` and `Local shard metadata's "
        "rank does not match` inside TorchRec's ShardedManagedCollisionCollection: 1.6 gathers "
        "MC table sizes over the whole world, not the sharding group (1.7 added `sharding_pg`)",
        "b2e2eb1: managed-collision tables on a TorchRec < 1.7 are refused before any "
        "collective, naming the version to install; MC on CUDA waits for a TorchRec >= 1.7 "
        "build for this torch",
    ),
    (
        "checkpoint, per-module fold and resource tests: `Not all tensors were on the same GPU: "
        'permute(CPU:-1), lengths(CUDA:0)`: their models were pinned to `device="cpu"` while '
        "the batches follow `SPARSE2D_TEST_DEVICE` (a test mismatch, not the library)",
        "c9d4d49: those builders use `rank_device()`; not yet rerun on a GPU",
    ),
    (
        "2D-vs-1D module teardown on CUDA: the 4-rank workers' thread count grew from 16 to 50 "
        "over the module's 14 checks (~9 per check; the suite allows +6), so the thread-release "
        "check failed at teardown. On CPU the same checks hold the bound",
        "open: not seen whether these are CUDA runtime or gloo-on-CUDA threads (which the "
        "library cannot release) or process groups left open; the next GPU check should list "
        "the new threads' names",
    ),
]
"""(what the log shows, what fixed it). Append on each GPU check."""


VERBOSE = {"PASSED": ".", "FAILED": "F", "ERROR": "E", "SKIPPED": "s"}
"""pytest -v outcome words as the letters of its -q progress line."""
MODULES_BY_LOG = {"guard.log": ["tests/test_sync_guard.py"]}
"""Modules of a diagnostic call run with -q, whose output names none."""
GLOBAL_BATCH = 512
"""Samples per step of ft_bench's launches: configs/ft_tiny_cpu.yaml, 4 ranks x 128."""


def _pytest_summary(text: str) -> str | None:
    found = re.findall(r"^(?:=+ )?(\d+ (?:passed|failed|error).*) in [\d.]+s", text, re.M)
    return found[-1] if found else None


def parse_run(folder: Path) -> dict[str, Any]:
    """What one call's logs say: versions and collectives (smoke), test outcomes, trainer,
    and the fault-tolerance benchmark on the machine's CPU cores."""
    run: dict[str, Any] = {"folder": folder.name}
    smoke = folder / "smoke.log"
    if smoke.exists():
        lines = [x for x in smoke.read_text().splitlines() if x.startswith("{")]
        run["smoke"] = json.loads(lines[-1]) if lines else None
    for name in ("equivalence.log", "eq.log"):  # eq.log: a diagnostic run with -x
        if (folder / name).exists():
            text = (folder / name).read_text()
            run["equivalence"] = {
                "summary": _pytest_summary(text) or "no summary (killed by the step's time limit)",
                "progress": "".join(
                    VERBOSE[w]
                    for w in re.findall(
                        r"(?:::\S+ |^)(PASSED|FAILED|ERROR|SKIPPED)(?:\s*\[.*\])?$", text, re.M
                    )
                )
                or "".join(re.findall(r"^(?!E\s*$)([.FEsx]+)\s*(?:\[\s*\d+%\])?$", text, re.M)),
                "timeouts": len(re.findall(r"Timeout", text)),
            }
    for log in sorted([*folder.glob("more*.log"), *folder.glob("guard.log")]):
        text = log.read_text()
        modules = sorted(set(re.findall(r"(tests/test_\w+\.py)::", text)))
        modules = modules or MODULES_BY_LOG.get(log.name, [])
        failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (tests/\S+)", text, re.M)))
        run.setdefault("modules", []).append(
            {"modules": modules, "summary": _pytest_summary(text), "failed": failed}
        )
    for log in sorted(folder.glob("train_*.log")):
        text = log.read_text()
        start = re.search(r"^\[start\] (.*)$", text, re.M)
        final = re.search(r"^final (.*)$", text, re.M)
        error = re.search(r"^sparse2d\.train: rank \d+: (.*)$", text, re.M)
        steps = re.findall(r"^\[train\] step=(\d+)", text, re.M)
        run[log.stem] = {
            "start": start.group(1)[:400] if start else None,
            # the line ends "-> RUN_DIR/summary.json": a path on the lent machine, not kept
            "final": re.sub(r" -> \S+$", "", final.group(1)) if final else None,
            "error": error.group(1) if error else None,
            "last_logged_step": int(steps[-1]) if steps else None,
        }
    ft = folder / "ft" / "ft_pipeline.json"
    if ft.exists():
        run["ft_bench"] = json.loads(ft.read_text())
    return run


def _ft_lines(ft: dict[str, Any]) -> list[str]:
    clean = ft["clean"]
    pairs = list(zip(clean["ft"], clean["std"], strict=True))
    mean = sum(f["samples_per_s"] for f, _ in pairs) / sum(s["samples_per_s"] for _, s in pairs)
    rounds = ", ".join(
        f"{f['samples_per_s']:.0f} vs {s['samples_per_s']:.0f} ({f['samples_per_s'] / s['samples_per_s']:.3f})"
        for f, s in pairs
    )
    waits = "; ".join(
        f"vote {f['vote_wait_ms_per_step']:.2f}, quorum {f['quorum_wait_ms_per_step']:.2f}, "
        f"echo {f['echo_wait_ms_per_step']:.2f}"
        for f in clean["ft"]
    )
    return [
        "",
        f"Fault tolerance vs the standard launcher on the same machine's CPU cores (gloo, "
        f"`bench/ft_bench.py --clean-only --pipeline {ft['pipeline']}`, "
        f"{len(pairs)} ABBA rounds, {ft['machine']}): the question was whether the 2-core "
        "box's gap (section `ft-pipeline`) is its oversubscription, 4 workers on 2 cores. "
        f"Here every worker has cores of its own. Samples/s fault tolerant vs standard by "
        f"round: {rounds}; ratio of the means **{mean:.3f}**. Waits in ms per step "
        f"(a step is {1000 * GLOBAL_BATCH / clean['std'][0]['samples_per_s']:.0f} ms here): "
        f"{waits}. So the gap does not go away with cores: the group's commit "
        "vote (~5% of a step) and the quorum (~2%) are what fault tolerance adds per step.",
    ]


def render(data: dict[str, Any]) -> str:
    lines = [
        "## CUDA check on a lent GPU machine (bench/cuda_check.py, bench/gpu/check.sh)",
        "",
        "One H100 with torch 2.11 (cu130) and no network: FBGEMM 1.6.0 (the release for "
        "torch 2.11; its sm_80/sm_100 cubins zeroed so it fits a 64 MiB call, "
        "`bench/gpu/prune_fatbin.py`), TorchRec 1.6.1 and torchft 0.2.0 were carried in "
        "(`bench/gpu/wheels.sh`). TorchRec 1.6 is older than the 1.8/1.9 sets sparse2d is "
        "tested on. NCCL refuses two ranks on one GPU, so the multi-rank tests move CUDA "
        "tensors over gloo (`SPARSE2D_TEST_DEVICE=cuda`), and the trainer ran CUDA + NCCL as "
        "one process. Device time: 15 min per session; the FBGEMM build travels in two "
        "64 MiB parts, so each machine start costs two calls.",
    ]
    for session in data["sessions"]:
        lines += ["", f"### {session['label']}", ""]
        smoke = next((r["smoke"] for r in session["runs"] if r.get("smoke")), None)
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
                "",
            ]
        lines += ["| call | step | outcome |", "|---|---|---|"]
        for number, run in enumerate(session["runs"], 1):
            call = f"call {number}"
            if eq := run.get("equivalence"):
                outcome = f"{eq['summary']}; progress `{eq['progress'] or '-'}`"
                lines.append(f"| {call} | 2D vs 1D (tests/test_core_collection.py) | {outcome} |")
            for key in sorted(k for k in run if k.startswith("train_")):
                t = run[key]
                outcome = f"ran: {t['final']}" if t["final"] else f"failed: `{t['error']}`"
                lines.append(f"| {call} | trainer, {key[6:]} | {outcome} |")
            for block in run.get("modules", []):
                by_module: dict[str, int] = {}
                for test in block["failed"]:
                    module = test.split("::")[0].removeprefix("tests/")
                    by_module[module] = by_module.get(module, 0) + 1
                failed = ", ".join(f"{m} {n}" for m, n in by_module.items())
                names = ", ".join(m.removeprefix("tests/") for m in block["modules"])
                outcome = block["summary"] or "no summary"
                lines.append(
                    f"| {call} | {names} | {outcome}"
                    + (f"; failed or errored, by module: {failed}" if failed else "")
                    + " |"
                )
            if run.get("ft_bench"):
                lines.append(f"| {call} | ft_bench on the CPU cores | below the tables |")
        for run in session["runs"]:
            if run.get("ft_bench"):
                lines += _ft_lines(run["ft_bench"])
    lines += ["", "### What the logs showed, and the fixes", ""]
    lines += ["| what the log shows | fix |", "|---|---|"]
    lines += [f"| {seen} | {fix} |" for seen, fix in data["findings"]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, action="append", default=[])
    parser.add_argument("--session", help="the new session's heading (with --run)")
    parser.add_argument("--render", action="store_true", help="from the saved JSON")
    args = parser.parse_args()
    data = json.loads(OUT.read_text()) if OUT.exists() else {"sessions": []}
    if args.run:
        if not args.session:
            parser.error("--run needs --session LABEL (the heading of this GPU session)")
        runs = [parse_run(folder) for folder in args.run]
        data["sessions"].append({"label": args.session, "runs": runs})
    elif not args.render:
        parser.error("give --run LOGDIR (with --session) or --render")
    data["findings"] = FINDINGS
    OUT.write_text(json.dumps(data, indent=1))
    text = render(data)
    print(text)
    last = data["sessions"][-1]["runs"]
    smoke = next((r["smoke"] for r in last if r.get("smoke")), {})
    stamp = {
        "sparse2d": "0.1.0",
        "git_commit": None,
        **{k: smoke.get(k) for k in ("torch", "torchrec", "fbgemm_gpu")},
        "backend": "nccl (1 rank) / gloo on CUDA (2-4 ranks)",
        "device_type": "cuda",
        "hosts": 1,
    }
    write_section(text, "cuda-check", stamp=stamp)


if __name__ == "__main__":
    main()
