"""The main job at every L: does 2D win on its own tables, as in production?

``configs/tiny_cpu.yaml`` through the trainer (``torch.distributed.run``, 4 gloo CPU
processes) at L=1 (full replication), L=2 (the shipped 2D layout) and L=4 (1D),
``--steps`` steps per run, ``--rounds`` rounds alternating the order of L so the machine's
load hits them alike; best and every round, and the ratios of L=2 to the other two (best
vs best). Then one full run (the config's steps and eval) at L=2 and at L=4 for the eval
AUC the README quotes, with the planted model's AUC and the wall time.

While exploring, ``--config`` points it at another job and ``--set KEY=VALUE`` (repeatable)
adds dotted overrides to every run; with ``--out DIR --no-results-md`` nothing shipped is
touched. The defaults measure the shipped main job.

Run: ``PYTHONPATH=. .venv/bin/python bench/main_job_layouts.py`` (483 s on the 2-core box at
load 9-17, the last full run).
Writes ``bench/results/main_job_layouts.json`` and the ``main-job-layouts`` section of
``bench/RESULTS.md``; prints the README sentence.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_util import RESULTS_DIR, publish, results_md, timed, write_section
from main_job_bench import run_trainer

HERE = Path(__file__).resolve().parent
GROUP_SIZES = (1, 2, 4)
CONFIG = HERE.parent / "configs" / "tiny_cpu.yaml"
RUN_KEYS = ("samples_per_s", "sync_s_per_step", "sync_bytes_per_step", "sync_modes", "eval_auc")
"""What each speed run keeps from its ``summary.json`` (with the 1-minute load at its end)."""


def measure(args: argparse.Namespace) -> dict[str, Any]:
    speed: dict[str, list[float]] = {str(L): [] for L in GROUP_SIZES}
    runs: dict[str, list[dict[str, Any]]] = {str(L): [] for L in GROUP_SIZES}
    loads = [os.getloadavg()[0]]
    full: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = GROUP_SIZES if r % 2 == 0 else tuple(reversed(GROUP_SIZES))
            for L in order:
                run_dir = os.path.join(tmp, f"{r}_{L}")
                s = run_trainer(
                    [f"parallel.sharding_group_size={L}", *args.set],
                    args.steps,
                    run_dir,
                    config=args.config,
                )
                speed[str(L)].append(s["samples_per_s"])
                runs[str(L)].append({"load": os.getloadavg()[0], **{k: s.get(k) for k in RUN_KEYS}})
                print(
                    f"round {r} L={L} {s['samples_per_s']:.0f} samples/s "
                    f"load {runs[str(L)][-1]['load']:.1f}",
                    flush=True,
                )
        loads.append(os.getloadavg()[0])
        for L in (2, 4) if args.full else ():
            begin = time.perf_counter()
            s = run_trainer(
                [f"parallel.sharding_group_size={L}", *shipped_eval(args.config), *args.set],
                args.full_steps,
                os.path.join(tmp, f"full_{L}"),
                config=args.config,
            )
            full[str(L)] = {
                "wall_s": time.perf_counter() - begin,
                **{
                    k: s.get(k)
                    for k in ("eval_auc", "planted_auc", "samples_per_s", "train_loss", "eval_loss")
                },
            }
            print(f"full L={L}", full[str(L)], flush=True)
    return {
        "samples_per_s": speed,
        "steps": args.steps,
        "rounds": args.rounds,
        "load": loads,
        "full": full,
        "runs": runs,
        "config": config_name(args.config),
        "overrides": list(args.set),
        "full_steps": args.full_steps,
        "shape": shape(args.config, args.set),
    }


def shipped_eval(config: Path) -> list[str]:
    """The config's own eval settings (``run_trainer`` turns eval off for speed runs)."""
    t = load(config).train
    return [f"train.eval_every={t.eval_every}", f"train.eval_batches={t.eval_batches}"]


def load(config: Path, overrides: list[str] | tuple[str, ...] = ()) -> Any:
    sys.path.insert(0, str(HERE.parent))
    from sparse2d.train.config import load_config

    return load_config(str(config), list(overrides))


def config_name(config: Path) -> str:
    try:
        return str(Path(config).resolve().relative_to(HERE.parent))
    except ValueError:
        return str(config)


def markdown(
    result: dict[str, Any], args: argparse.Namespace, wall: float, repeat: Path | None = None
) -> str:
    best = {L: max(v) for L, v in result["samples_per_s"].items()}
    lines = [
        "## Main job at every L (bench/main_job_layouts.py)",
        "",
        f"`{result.get('config', 'configs/tiny_cpu.yaml')}`"
        f"{' with ' + ' '.join(result['overrides']) if result.get('overrides') else ''} "
        f"({shape(args.config, args.set)}) through "
        f"the trainer, 4 gloo CPU processes, {result['steps']} steps per run, "
        f"{result['rounds']} rounds alternating the order of L; {args.machine}. The box is "
        f"shared with other agents: absolute samples/s are not comparable with other "
        f"sections, the ratios within this run are what counts. Wall {wall:.0f} s.",
        "",
        "| L | layout | best samples/s | every round |",
        "|---:|---|---:|---|",
    ]
    names = {"1": "full replication", "2": "2D (shipped)", "4": "1D"}
    for L, runs in result["samples_per_s"].items():
        lines.append(
            f"| {L} | {names[L]} | {best[L]:.0f} | {', '.join(f'{x:.0f}' for x in runs)} |"
        )
    lines += ["", sentence(result)]
    if repeat is not None:
        lines += ["", repeat_paragraph(result, json.loads(repeat.read_text()))]
    return "\n".join(lines)


def candidates_section(paths: list[Path]) -> str:
    """The ``main-job-candidates`` section: every candidate main job measured while looking
    for one where 2D (L=2) is the fastest layout, rendered from the runs' JSON files."""
    lines = [
        "## Main-job candidates: a job where 2D is the fastest L? "
        "(bench/main_job_layouts.py --candidates)",
        "",
        "Issue 33 item 5 asked for main-job tables large enough that a 2D layout (L=2) is the "
        "measured best of L=1 (full replication), 2 and 4 (1D) on this 2-core box. Each "
        "candidate is `configs/tiny_cpu.yaml` with dotted overrides, measured by this script "
        "(`--set` per override, `--no-full`): 4 gloo CPU processes through the trainer, rounds "
        "alternating the order of L, the 1-minute load average after each run. A candidate "
        "counts only if L=2 is fastest in most rounds by more than the round-to-round noise. "
        "Raw runs: `bench/inputs/main_job_candidates/`.",
        "",
        "| candidate | job | steps x rounds | L=1 samples/s | L=2 | L=4 | load | "
        "L=2 / L=1, / L=4 (best) | L=2 fastest | L=2 sync ms/step |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    wins = 0
    for path in paths:
        r = json.loads(path.read_text())
        speed = r["samples_per_s"]
        best = {L: max(v) for L, v in speed.items()}
        rounds = list(zip(*(speed[L] for L in ("1", "2", "4")), strict=True))
        fastest = sum(r2 > max(r1, r4) for r1, r2, r4 in rounds)
        wins += fastest * 2 > len(rounds)
        loads = [x["load"] for v in r["runs"].values() for x in v]
        sync = ", ".join(f"{1e3 * x['sync_s_per_step']:.1f}" for x in r["runs"]["2"])
        cells = [", ".join(f"{x:.0f}" for x in speed[L]) for L in ("1", "2", "4")]
        lines.append(
            f"| {path.stem} | {r['shape']} | {r['steps']} x {r['rounds']} | {' | '.join(cells)} "
            f"| {min(loads):.1f}-{max(loads):.1f} | {best['2'] / best['1']:.2f}, "
            f"{best['2'] / best['4']:.2f} | {fastest} of {len(rounds)} | {sync} |"
        )
    lines += [
        "",
        f"L=2 was the fastest layout in most rounds in {wins} of {len(paths)} candidates.",
    ]
    return "\n".join(lines)


def shape(config: Path = CONFIG, overrides: list[str] | tuple[str, ...] = ()) -> str:
    """The job's tables, batch and sync, read from the config (not restated by hand)."""
    cfg = load(config, overrides)
    specs = cfg.model.specs()
    rows = sorted({t.rows for t in specs})
    kinds = sorted({t.sharding or "planner's choice" for t in specs})
    sync = cfg.parallel.sync
    return (
        f"{len(specs)} tables x {'/'.join(str(r) for r in rows)} rows, dim {specs[0].dim}, "
        f"{'/'.join(kinds)}, bags of 1-{cfg.data.synthetic.ids_per_feature} ids, batch "
        f"{cfg.data.batch_size_per_rank} per rank, sync every {sync.every} step"
        f"{'s' if sync.every > 1 else ''} (engine {sync.engine})"
    )


def sentence(result: dict[str, Any]) -> str:
    best = {L: max(v) for L, v in result["samples_per_s"].items()}
    wins = sum(
        r2 > max(r1, r4)
        for r1, r2, r4 in zip(*(result["samples_per_s"][L] for L in ("1", "2", "4")), strict=True)
    )
    text = (
        f"L=2 (2D) trains at {best['2'] / best['1']:.2f}x the samples/s of full replication "
        f"(L=1) and {best['2'] / best['4']:.2f}x 1D (L=4), best of {result['rounds']} "
        f"alternating rounds (L=2 fastest in {wins} of {result['rounds']} rounds)."
    )
    full = result.get("full") or {}
    if full:
        text += (
            f" {result.get('full_steps', 1000)} steps with eval: eval AUC {full['2']['eval_auc']:.4f} in 2D, "
            f"{full['4']['eval_auc']:.4f} in 1D, {full['2']['planted_auc']:.4f} for the planted "
            f"model ({full['2']['wall_s']:.0f} s wall for the 2D run on the loaded box)."
        )
    return text


def repeat_paragraph(result: dict[str, Any], repeat: dict[str, Any]) -> str:
    """A second run of this bench (``--rounds 4 --no-full``, given as ``--repeat``) beside
    ``result``: its best-vs-best ratios and the rounds each L won, pooled over both runs."""
    speed = repeat["samples_per_s"]
    best = {L: max(v) for L, v in speed.items()}
    rounds = [
        dict(zip(("1", "2", "4"), r, strict=True))
        for run in (result, repeat)
        for r in zip(*(run["samples_per_s"][L] for L in ("1", "2", "4")), strict=True)
    ]
    over_full = sum(r["2"] > r["1"] for r in rounds)
    one_d = sum(r["4"] > r["2"] for r in rounds)
    every = "; ".join(f"L={L} {', '.join(f'{x:.0f}' for x in v)}" for L, v in speed.items())
    return (
        f"A repeat with {repeat['rounds']} rounds (`bench/main_job_layouts.py --rounds "
        f"{repeat['rounds']} --no-full`, raw: `bench/inputs/main_job_layouts_repeat.json`, load "
        f"{repeat['load'][0]:.1f} -> {repeat['load'][-1]:.1f}): {every} samples/s: L=2 at "
        f"{best['2'] / best['1']:.2f}x full replication and {best['2'] / best['4']:.2f}x 1D "
        f"(best vs best). Pooled over both runs, L=2 beat L=1 in {over_full} of {len(rounds)} "
        f"rounds, and L=4 beat L=2 in {one_d} of {len(rounds)}."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config",
        type=Path,
        default=CONFIG,
        help="the job to measure (default: the main job, as shipped)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a dotted override for every run (repeatable; while exploring)",
    )
    parser.add_argument("--steps", type=int, default=200, help="steps per speed run")
    parser.add_argument("--rounds", type=int, default=3, help="rounds alternating L")
    parser.add_argument(
        "--full-steps",
        type=int,
        help="steps of the two runs with eval (default: the config's train.steps)",
    )
    parser.add_argument("--no-full", dest="full", action="store_false")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-results-md", action="store_true")
    parser.add_argument(
        "--candidates",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="render the main-job-candidates section from these runs' JSON "
        "(bench/inputs/main_job_candidates/*.json) and exit",
    )
    parser.add_argument(
        "--repeat",
        type=Path,
        help="an earlier run's JSON to report beside "
        "this one (bench/inputs/main_job_layouts_repeat.json)",
    )
    args = parser.parse_args(argv)
    if args.candidates:
        text = candidates_section(sorted(args.candidates))
        print(text)
        if not args.no_results_md:
            write_section(text, "main-job-candidates", results_md(args.out))
        return 0
    if args.full_steps is None:
        args.full_steps = load(args.config, args.set).train.steps
    result, wall = timed(args, measure, args)
    publish(
        args,
        result,
        markdown(result, args, wall, args.repeat),
        "main_job_layouts.json",
        "main-job-layouts",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
