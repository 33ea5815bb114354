"""Every sync option on the flat host, end to end: which ones earn their keep (issue 56)?

The shipped main job (``configs/tiny_cpu.yaml``: world 4 on one host, L=2, two replicas)
through the trainer (``torch.distributed.run``, 4 gloo CPU processes), once per setting of
``parallel.sync`` (``SETTINGS``: the main job's own settings, ``engine: auto`` and the
default ``hide: true``, and each option changed alone), at a
sync every step and every 10 steps. All runs of one cadence alternate their order round by
round (ABAB... then reversed), in one process, so the box's load hits them alike; reported
per setting: samples/s (mean over the rounds, the trainer's own) and its ratio to the
default's in the same cadence, the sync's ms and KB per step, and the eval AUC after the
run's steps (10 eval batches at the end; the planted model's AUC beside it).

The cluster half of the evidence is ``bench/cluster_bench.py``'s ``cluster-options`` section;
``markdown`` states which options the two retired (issue 56 item 1).

Run: ``PYTHONPATH=. .venv/bin/python bench/sync_options_bench.py`` (about 25 min on 2 cores).
Writes ``bench/results/sync_options.json`` and the ``sync-options`` section of
``bench/RESULTS.md``; ``--render JSON`` re-renders a saved run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_util import RESULTS_DIR, publish, stored_stamp, timed
from cluster_report import options_figures
from main_job_bench import run_trainer

MARKER = "sync-options"
"""The section of ``bench/RESULTS.md`` this bench writes."""

DEFAULT = "default"
SETTINGS: dict[str, list[str]] = {
    DEFAULT: [],
    "engine=dense": ["parallel.sync.engine=dense"],
    "engine=sparse": ["parallel.sync.engine=sparse"],
    "hide=false": ["parallel.sync.hide=false"],
}
"""Each setting: ``parallel.sync`` overrides on top of the main job's (``default``)."""

RETIRED_SETTINGS: dict[str, list[str]] = {
    "overlap=true": ["parallel.sync.overlap=true"],
    "compression=bf16 (engine=dense)": [
        "parallel.sync.compression=bf16",
        "parallel.sync.engine=dense",
    ],
}
"""The settings of the options this bench's run of 2026-11-28 retired: their rows are in that
run's JSON (``bench/results/sync_options.json``, which ``--render`` re-renders); the options
no longer exist, so a new run cannot measure them (the trainer refuses the keys)."""

EVERY = (1, 10)
RUN_KEYS = (
    "samples_per_s",
    "sync_s_per_step",
    "sync_bytes_per_step",
    "sync_modes",
    "eval_auc",
    "planted_auc",
)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    settings = {name: (SETTINGS | RETIRED_SETTINGS)[name] for name in args.settings}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        str(e): {name: [] for name in settings} for e in args.every
    }
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for every in args.every:
                names = list(settings) if r % 2 == 0 else list(reversed(settings))
                for name in names:
                    run_dir = os.path.join(tmp, f"{r}_{every}_{len(runs[str(every)][name])}")
                    extra = [
                        f"parallel.sync.every={every}",
                        f"train.eval_every={args.steps}",
                        f"train.eval_batches={args.eval_batches}",
                        *settings[name],
                    ]
                    try:
                        s = run_trainer(extra, args.steps, os.path.join(run_dir, name[:12]))
                        entry = {"load": os.getloadavg()[0], **{k: s.get(k) for k in RUN_KEYS}}
                    except RuntimeError as error:  # recorded, not hidden
                        entry = {"load": os.getloadavg()[0], "error": str(error)[-600:]}
                    runs[str(every)][name].append(entry)
                    print(f"round {r} every={every} {name}: {entry}", flush=True)
    return {"steps": args.steps, "rounds": args.rounds, "runs": runs}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Means over a setting's rounds (None when every round failed)."""
    ok = [x for x in runs if "error" not in x]
    if not ok:
        return None

    def mean(key: str) -> float:
        values = [x[key] for x in ok if x.get(key) is not None]
        return statistics.mean(values) if values else float("nan")

    return {
        "samples_per_s": mean("samples_per_s"),
        "rounds": [x["samples_per_s"] for x in ok],
        "sync_ms": 1e3 * mean("sync_s_per_step"),
        "sync_kb": mean("sync_bytes_per_step") / 1e3,
        "eval_auc": mean("eval_auc"),
        "planted_auc": mean("planted_auc"),
        "failed": len(runs) - len(ok),
    }


def ratios(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """samples/s over the default's, per cadence and setting (mean over rounds)."""
    out: dict[str, dict[str, float]] = {}
    for every, by_name in result["runs"].items():
        base = summarize(by_name[DEFAULT])
        out[every] = {}
        for name, runs in by_name.items():
            s = summarize(runs)
            if s is not None and base is not None:
                out[every][name] = s["samples_per_s"] / base["samples_per_s"]
    return out


RETIRED = (
    "**Retired by this measurement and the cluster's** (issue 56 item 1: an option that wins "
    "on neither host and that the blog or paper does not name goes, with its code, tests and "
    "docs; rows marked (retired) above are that evidence, and a new run cannot measure them): "
    "**`overlap`** (start the all-reduce at one sync, land it at the next with delta "
    "correction) {overlap}; on the emulated cluster (section `cluster-options`, L=4 "
    "inter-host, 2 hosts x 4 ranks, a sync every 20 steps) it ran at {c_overlap}, and it "
    "hid {hidden_every1} of a sync at a sync every step (section sync-bench). **`compression: "
    "bf16`** {bf16}; on the cluster it ran {c_bf16}; its sync alone took {bf16_x} the fp32 "
    "sync's time on the flat host (section sync-bench). **Kept:** `engine` (each value wins "
    "somewhere: on the cluster {c_engine}; here dense {dense}; sparse sends fewer bytes when "
    "few rows are touched, section sparse-sync) and `hide` {hide}. **One default "
    "everywhere** (the trainer used to override the library's): `SyncOptions()` is the "
    "trainer's `parallel.sync`: `engine: dense` (its sync took {dense_ms} ms a step here "
    "beside auto's {auto_ms} at a sync every step) and `hide: true` (blocking lost here); the "
    "shipped configs keep choosing `engine: auto` in their YAML."
)
"""The verdict; its cluster figures come from ``bench/results/cluster_options.json``
(``cluster_report.options_figures``), its flat-host ones from this run."""

SYNC_BENCH = RESULTS_DIR / "sync_bench.json"
"""The retired options' sync alone on the flat host: ``bench/sync_bench.py``'s stored run."""

CLUSTER = RESULTS_DIR / "cluster_options.json"
"""The cluster half of the evidence: ``bench/cluster_bench.py --preset options``'s stored run."""


def sync_bench_reading(run: dict[str, Any]) -> dict[str, str]:
    """The retired options in ``bench/sync_bench.py``'s stored run (its ``retired`` rows)."""
    retired = run["retired"]
    every1 = next(r for r in retired["overlap"] if r["every"] == 1)
    return {
        "hidden_every1": f"{every1['hidden']:.2f}",
        "bf16_x": f"{retired['bf16']['s'] / run['worst']['dense']:.1f}x",
    }


def cluster_reading(cluster: dict[str, Any]) -> dict[str, str]:
    """The retired options and the engines on the emulated cluster, per link, from its run."""
    links = options_figures(cluster)

    def ratio(link: str, a: str, b: str, key: str = "samples_per_s") -> str:
        x, y = links[link].get(a, {}).get(key), links[link].get(b, {}).get(key)
        return f"{x / y:.2f}x" if x and y else "-"

    def auc(name: str) -> str:
        values = {
            f"{s[name]['eval_auc']:.3f}" for s in links.values() if s.get(name, {}).get("eval_auc")
        }
        return "/".join(sorted(values)) or "-"

    return {
        "c_overlap": " and ".join(
            f"{ratio(x, 'auto overlap=true', 'auto')} `auto` at {x}" for x in links
        )
        + f" (eval AUC {auc('auto overlap=true')} vs {auc('auto')})",
        "c_bf16": "; ".join(
            f"at {x}, {ratio(x, 'dense compression=bf16', 'dense')} dense and "
            f"{ratio(x, 'dense compression=bf16', 'auto')} `auto`, sending "
            f"{ratio(x, 'dense compression=bf16', 'dense', 'host_link_bytes_per_step')} dense's "
            "host-link bytes"
            for x in links
        ),
        "c_engine": " and ".join(f"`auto` {ratio(x, 'auto', 'dense')} dense at {x}" for x in links),
    }


def _verdict(r: dict[str, dict[str, float]], name: str, auc: dict[str, dict[str, Any]]) -> str:
    """``name``'s ratios to the default at each cadence, with its AUC beside the default's."""
    parts = []
    for every, by_name in r.items():
        if name in by_name:
            parts.append(
                f"{by_name[name]:.2f}x the default's samples/s at every={every} "
                f"(AUC {auc[every][name]['eval_auc']:.4f} vs {auc[every][DEFAULT]['eval_auc']:.4f})"
            )
    return "ran at " + " and ".join(parts) + " on the flat host" if parts else "(not measured)"


def _sync_ms(summaries: dict[str, dict[str, Any]], name: str) -> str:
    """``name``'s sync ms per step at a sync every step, as the table shows it."""
    s = summaries.get("1", {}).get(name)
    return "-" if s is None else f"{s['sync_ms']:.1f}"


def markdown(
    result: dict[str, Any],
    args: argparse.Namespace,
    wall: float,
    cluster: dict[str, Any] | None = None,
) -> str:
    """The section: the table (retired settings' rows marked) and the verdict, its cluster
    figures from ``cluster`` (by default the stored ``CLUSTER`` run)."""
    cluster = json.loads(CLUSTER.read_text()) if cluster is None else cluster
    r = ratios(result)
    summaries = {
        every: {name: summarize(runs) for name, runs in by_name.items()}
        for every, by_name in result["runs"].items()
    }
    lines = [
        "## Sync options on the flat host, end to end (bench/sync_options_bench.py)",
        "",
        f"`configs/tiny_cpu.yaml` (world 4 on one host, L=2, two replicas) through the "
        f"trainer, 4 gloo CPU processes, {result['steps']} steps a run and "
        f"{args.eval_batches} eval batches at its end; each setting is the main job's own "
        f"(`engine: auto` from its YAML, `hide: true` by default: `default` below) with one "
        f"`parallel.sync` option changed; "
        f"{result['rounds']} rounds, the settings of a cadence alternating their order round "
        f"by round; {args.machine}. samples/s: mean over the rounds (each the trainer's own); "
        f"x default: ratio to the default's mean in the same cadence. The box is shared: "
        f"single rounds move by 10-30%, so only a ratio clearly away from 1.00 counts. "
        f"Wall {wall:.0f} s. Reproduce: `PYTHONPATH=. .venv/bin/python "
        f"bench/sync_options_bench.py --rounds {result['rounds']} --steps {result['steps']}` "
        "(the retired settings can no longer run; `--render bench/results/sync_options.json` "
        "re-renders their rows).",
        "",
        "| every | setting | samples/s | rounds | x default | sync ms/step | sync KB/step "
        "| eval AUC | planted AUC |",
        "|---:|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for every, by_name in summaries.items():
        for name, s in by_name.items():
            shown = f"{name} (retired)" if name in RETIRED_SETTINGS else name
            if s is None:
                lines.append(f"| {every} | {shown} | failed | | | | | | |")
                continue
            lines.append(
                f"| {every} | {shown} | {s['samples_per_s']:.0f} | "
                f"{', '.join(f'{x:.0f}' for x in s['rounds'])} | {r[every][name]:.2f} | "
                f"{s['sync_ms']:.2f} | {s['sync_kb']:.0f} | {s['eval_auc']:.4f} | "
                f"{s['planted_auc']:.4f} |"
            )
    lines += [
        "",
        RETIRED.format(
            overlap=_verdict(r, "overlap=true", summaries),
            bf16=_verdict(r, "compression=bf16 (engine=dense)", summaries),
            hide="(`hide=false` " + _verdict(r, "hide=false", summaries) + ")",
            dense=_verdict(r, "engine=dense", summaries),
            dense_ms=_sync_ms(summaries, "engine=dense"),
            auto_ms=_sync_ms(summaries, DEFAULT),
            **cluster_reading(cluster),
            **sync_bench_reading(json.loads(SYNC_BENCH.read_text())),
        ),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400, help="steps per run")
    parser.add_argument("--rounds", type=int, default=2, help="rounds alternating the settings")
    parser.add_argument("--eval-batches", type=int, default=10)
    parser.add_argument("--every", type=int, nargs="+", default=list(EVERY))
    parser.add_argument(
        "--settings", nargs="+", default=list(SETTINGS), choices=[*SETTINGS, *RETIRED_SETTINGS]
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-results-md", action="store_true")
    parser.add_argument("--render", metavar="JSON", help="re-render a saved run, no measuring")
    args = parser.parse_args(argv)
    if args.render:
        result = json.loads(Path(args.render).read_text())
        args.machine, args.eval_batches = result["machine"], result["eval_batches"]
        text = markdown(result, args, result["wall_s"])
        publish(args, result, text, "sync_options.json", MARKER, stored_stamp(MARKER, args.out))
        return 0
    result, wall = timed(args, measure, args)
    result.update(machine=args.machine, wall_s=wall, eval_batches=args.eval_batches)
    publish(args, result, markdown(result, args, wall), "sync_options.json", MARKER)
    return 0


if __name__ == "__main__":
    sys.exit(main())
