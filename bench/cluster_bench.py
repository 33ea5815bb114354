"""2D against 1D and full replication on an emulated cluster (``launch/emulated_hosts.sh``).

Each cell is one training run of the cluster job (``configs/cluster_cpu.yaml`` by default) on
``HOSTS x NPROC`` ranks whose host links are shaped to a rate: one network namespace per host,
gloo over each host's own interface. Per cell: samples/s (the trainer's own, over every
round), eval AUC at equal steps, and the bytes that crossed host links per step, read from the
hosts' interface counters (the trainer's ``host_link_bytes_per_step``: what ``ip -s link``
prints, summed over hosts), never estimated. Strategies run in alternating order round by
round (A B C, C B A, ...), so a drift of the shared 2-core box does not favour one.

    sudo .venv/bin/python bench/cluster_bench.py                      # the full matrix
    .venv/bin/python bench/cluster_bench.py --preset main             # the cluster main job's
    .venv/bin/python bench/cluster_bench.py --render                  # re-render from JSON

Strategies: ``1D`` (L = T), ``L=1`` (full replication), and 2D at each other ``L`` dividing T
with both replica layouts (``intra``: replicas of a shard on one host, the sharding group
spans hosts; ``inter``: the sharding group inside a host, replicas across hosts); each with a
sync every ``--every`` steps and the ``--engines`` (dense rows or touched rows).
Writes ``bench/results/cluster[_<preset>].json``, its plot and its RESULTS.md section.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench_util import RESULTS_DIR, machine_note, publish, stored_stamp
from cluster_faults import cluster_name, remove_cluster
from cluster_report import plot, render, stored_switch

from sparse2d.sync.options import RETIRED
from sparse2d.train.emulated_topology import topology_yaml

ROOT = Path(__file__).resolve().parent.parent
LAUNCHER = ROOT / "launch" / "emulated_hosts.sh"


@dataclass(frozen=True, slots=True)
class Strategy:
    """One way to lay the job out: the overrides that give it, and a short label."""

    group_size: int
    layout: str = "inter_host"
    every: int = 1
    engine: str = "dense"
    auto: str = ""
    """``model``: ``sharding_group_size`` and ``replica_layout`` both ``auto`` (the cost
    model's pick); ``measured``: stored runs only, made while a trial on the job decided
    (retired, bench/RESULTS.md section auto); empty: the fixed layout above."""
    switch: str = ""
    """A ``parallel.sync`` option changed for this run (``key=value``, e.g. ``hide=false``):
    what the ``options`` preset measures each sync option by."""

    @classmethod
    def from_stored(cls, raw: dict[str, Any]) -> Strategy:
        """The strategy a stored run recorded (older runs' keys read by ``stored_switch``)."""
        fields = {k: v for k, v in raw.items() if k not in ("bf16", "switch")}
        return cls(**fields, switch=stored_switch(raw))

    @property
    def retired(self) -> bool:
        """Whether the switch is an option retired by measurement (``sync.options.RETIRED``):
        such a row is the evidence of its retirement; the trainer refuses the key now."""
        return self.switch.split("=")[0] in RETIRED

    def label(self, world: int) -> str:
        if self.auto:
            return f"auto ({self.auto}) every {self.every} {self.engine}"
        if self.group_size == world:
            return "1D"
        text = "L=1" if self.group_size == 1 else f"L={self.group_size} {self.layout[:5]}"
        text += f" every {self.every} {self.engine}"
        return text + (f" {self.switch}" if self.switch else "")

    def overrides(self) -> list[str]:
        if self.auto:
            return [
                "parallel.sharding_group_size=auto",
                "parallel.replica_layout=auto",
                f"parallel.sync.every={self.every}",
                f"parallel.sync.engine={self.engine}",
                "parallel.sync.stream=false",
            ]
        return [
            f"parallel.sharding_group_size={self.group_size}",
            f"parallel.replica_layout={self.layout}",
            f"parallel.sync.every={self.every}",
            f"parallel.sync.engine={self.engine}",
            # a burst unless the switch streams: every stored run before streams was one
            # (the shipped config streams now)
            *([] if self.switch.startswith("stream=") else ["parallel.sync.stream=false"]),
            *([f"parallel.sync.{self.switch}"] if self.switch else []),
        ]


def strategies(
    world: int,
    every: list[int],
    engines: list[str],
    group_sizes: list[int] | None = None,
    auto: list[str] = (),  # type: ignore[assignment]
    layouts: list[str] | None = None,
    switches: list[str] = (),  # type: ignore[assignment]
) -> list[Strategy]:
    """1D, full replication and every 2D layout of ``world`` ranks (or only ``layouts``),
    crossed with the options; each of ``switches`` once more on top of the first engine. The layouts of L=1 and L=T are one and the same (one replica group, one
    sharding group)."""
    sizes = group_sizes or [d for d in range(1, world + 1) if world % d == 0]
    out = [Strategy(world)] if world in sizes else []
    for size in sizes:
        if size == world:
            continue
        kept = ["inter_host"] if size == 1 else ["intra_host", "inter_host"]
        for layout in [x for x in kept if size == 1 or layouts is None or x in layouts]:
            for n in every:
                for engine in engines:
                    out.append(Strategy(size, layout, n, engine))
                out += [Strategy(size, layout, n, engines[0], switch=x) for x in switches]
    for kind in auto:  # the advisor's pick at the job's own cadence and engine
        if kind != "model":
            raise ValueError(
                f"--auto {kind}: only 'model' runs now (the measured trial was retired: "
                "bench/RESULTS.md section auto); stored 'measured' rows still render"
            )
        out += [Strategy(0, every=n, engine=engines[0], auto=kind) for n in every]
    return out


@dataclass(slots=True)
class Cell:
    """One strategy on one cluster and link: each round's measurement."""

    hosts: int
    nproc: int
    link: str
    strategy: Strategy
    runs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def world(self) -> int:
        return self.hosts * self.nproc


def run_once(cell: Cell, args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    """One launch of the emulated cluster; the summary's figures (or the error's last line)."""
    env = {
        **os.environ,
        "HOSTS": str(cell.hosts),
        "NPROC": str(cell.nproc),
        "LINK": cell.link,
        "CONFIG": str(ROOT / args.config),
        "HOST_RESTARTS": "0",
        "MAX_RESTARTS": "0",
        "CLUSTER_ID": cluster_name("cluster_bench"),
    }
    command = [
        "bash",
        str(LAUNCHER),
        *cell.strategy.overrides(),
        f"train.steps={args.steps}",
        f"run_dir={run_dir}",
        "train.progress_bar=false",
        "train.eval_every=0",
        *args.set,
    ]
    shutil.rmtree(run_dir, ignore_errors=True)  # a new run each time (the trainer refuses
    start = time.perf_counter()  # to append a second run's records to a run_dir's first)
    try:  # a timeout SIGKILLs the launcher, whose trap then never removes its cluster
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=args.timeout
        )
    finally:
        remove_cluster(env["CLUSTER_ID"])
    wall = time.perf_counter() - start
    summary_path = run_dir / "summary.json"
    if done.returncode != 0 or not summary_path.exists():
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"error": f"rc {done.returncode}: {' | '.join(tail)}", "wall_s": wall}
    summary = json.loads(summary_path.read_text())
    predicted = predicted_step_s(cell, args, run_dir, summary)
    return {
        "sharding_group_size": summary["sharding_group_size"],
        "replica_layout": summary.get("replica_layout"),
        "predicted_step_s": predicted,
        "samples_per_s": summary["samples_per_s"],
        "eval_auc": summary.get("eval_auc"),
        "eval_loss": summary.get("eval_loss"),
        "host_link_bytes_per_step": summary.get("host_link_bytes_per_step"),
        "sync_s_per_step": summary.get("sync_s_per_step"),
        "step_s": summary["global_batch_size"] / summary["samples_per_s"],
        "wall_s": wall,
    }


def repo_path(path: str | Path) -> str:
    """``path`` as the results store it: relative to the repository when inside it, so a
    stored run names no machine's folders."""
    path = Path(path)
    if path.is_absolute() and path.is_relative_to(ROOT):
        return str(path.relative_to(ROOT))
    return str(path)


def predicted_step_s(
    cell: Cell, args: argparse.Namespace, run_dir: Path, summary: dict[str, Any]
) -> float | None:
    """The cost model's step time for the layout the run trained in, on the topology the
    emulator wrote for it (``RUN_DIR/topology.yaml``: its hosts, cores and links). A row of a
    retired option is priced as its setting without that option."""
    candidate = predicted_candidate(cell, args, run_dir, summary)
    return None if candidate is None else candidate.step_s


def predicted_candidate(
    cell: Cell, args: argparse.Namespace, run_dir: Path, summary: dict[str, Any]
) -> Any:
    """The cost model's whole estimate (``Candidate``: step, terms, host-link bytes) behind
    ``predicted_step_s``; None without the run's topology file."""
    import dataclasses

    from sparse2d.advisor.search import advise
    from sparse2d.advisor.topology import load_topology
    from sparse2d.train.advisor_command import workload_from_config
    from sparse2d.train.config import load_config

    topology_file = run_dir / "topology.yaml"
    if not topology_file.exists():
        return None
    strategy = cell.strategy
    if strategy.retired:  # the cost model never priced it, and the loader refuses it now
        strategy = dataclasses.replace(strategy, switch="")
    cfg = load_config(str(ROOT / args.config), [*strategy.overrides(), *args.set])
    layout = summary.get("replica_layout") or "intra_host"
    workload = dataclasses.replace(workload_from_config(cfg), replica_layout=layout)
    advice = advise(workload, load_topology(str(topology_file), cell.world))
    return advice.candidate(int(summary["sharding_group_size"]))


def repredict(result: dict[str, Any]) -> None:
    """Each stored run's ``predicted_step_s`` again, on the topology file the emulator writes
    today for its cluster (``launch/emulated_hosts.sh``: cpu_gloo, its hosts and ranks, every
    core of this machine per host, the link): a change of the model or of that file is
    checked against the measurements already made, without measuring again."""
    import tempfile

    result["predicted"] = (
        "Predicted: priced again (`--repredict`) on the topology the emulator writes now "
        "(each host with twice its even share of the cores), the measurements as stored."
    )
    with tempfile.TemporaryDirectory() as folder:
        for raw in result["cells"]:
            strategy = Strategy.from_stored(raw["strategy"])
            cell = Cell(raw["hosts"], raw["nproc"], raw["link"], strategy)
            run_dir = Path(folder) / f"{cell.hosts}x{cell.nproc}_{cell.link}"
            run_dir.mkdir(exist_ok=True)
            (run_dir / "topology.yaml").write_text(topology_yaml(cell.hosts, cell.nproc, cell.link))
            args = argparse.Namespace(config=result["config"], set=result.get("overrides", []))
            for run in raw["runs"]:
                if "sharding_group_size" in run:
                    run["predicted_step_s"] = predicted_step_s(cell, args, run_dir, run)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    cells: list[Cell] = []
    for shape in args.shapes:
        hosts, nproc = (int(x) for x in shape.split("x"))
        world = hosts * nproc
        plan = strategies(
            world,
            args.every,
            args.engines,
            args.group_sizes,
            args.auto,
            args.layouts,
            args.switches,
        )
        for link in args.links:
            cells += [Cell(hosts, nproc, link, s) for s in plan]
        if args.bounds:  # each 2D strategy once more on unshaped links: its compute bound
            cells += [Cell(hosts, nproc, "none", s) for s in plan if s.group_size != world]
    load = os.getloadavg()[0]
    scratch = Path(args.scratch)
    for r in range(args.rounds):
        order = cells if r % 2 == 0 else cells[::-1]
        for i, cell in enumerate(order):
            run_dir = scratch / f"r{r}_c{cells.index(cell)}"
            result = run_once(cell, args, run_dir)
            cell.runs.append(result)
            label = cell.strategy.label(cell.world)
            shown = result.get("error") or f"{result['samples_per_s']:.0f} samples/s"
            print(
                f"[round {r} {i + 1}/{len(cells)}] {cell.hosts}x{cell.nproc} {cell.link} "
                f"{label}: {shown}",
                flush=True,
            )
    return {
        "config": repo_path(args.config),
        "steps": args.steps,
        "rounds": args.rounds,
        "overrides": args.set,
        "machine": machine_note(load),
        "cells": [
            {
                "hosts": c.hosts,
                "nproc": c.nproc,
                "link": c.link,
                "strategy": asdict(c.strategy),
                "label": c.strategy.label(c.world),
                "runs": c.runs,
            }
            for c in cells
        ],
    }


PRESETS: dict[str, dict[str, Any]] = {
    # The acceptance's cell: the shipped setting against 1D and full replication, 2 x 4 ranks
    # at 200 Mbit/s, sync every 20 (the shipped cadence), and the advisor's pick.
    "main": {
        "shapes": ["2x4"],
        "links": ["200mbit"],
        "every": [20],
        "engines": ["auto"],
        "group_sizes": [1, 4, 8],
        "auto": ["model"],
        "rounds": 3,
        "steps": 100,
    },
}


PRESETS["main_every10"] = {**PRESETS["main"], "every": [10], "steps": 200}
"""The same cell at the cadence measured first (a sync every 10 steps): kept beside it."""

PRESETS["options"] = {
    **PRESETS["main"],
    "links": ["100mbit", "1gbit"],
    "engines": ["auto", "dense", "sparse"],
    "group_sizes": [4],
    "layouts": ["inter_host"],
    "switches": ["hide=false"],
    "auto": [],
    "rounds": 2,
    "steps": 60,
}
"""Each sync option alone on the shipped 2D layout, on a slow and a fast link: the
measurement that keeps or retires it (issue 56)."""

PRESETS["stream"] = {
    **PRESETS["main"],
    "engines": ["auto"],
    "group_sizes": [4, 8],
    "layouts": ["inter_host"],
    "switches": ["stream=true"],
    "auto": [],
    "bounds": True,
    "rounds": 2,
    "steps": 300,
}
"""The shipped cell (``make train-cluster``'s job, 300 steps as it ships) with its sync as a
burst every 20 steps and streamed over the 20, against 1D; each 2D cell also on unshaped links
(its compute bound; issue 63)."""

PRESETS["cadence"] = {
    **PRESETS["main"],
    "every": [1, 10],
    "group_sizes": [1, 4, 8],
    "layouts": ["inter_host"],
    "auto": [],
    "rounds": 2,
    "steps": 30,
}
"""The main cell at a sync every step and every 10 (30 steps: full replication syncing
every step moves all its tables across the hosts each step)."""

MARKERS = {
    None: "cluster",
    "main": "cluster-main",
    "main_every10": "cluster-main-every10",
    "options": "cluster-options",
    "cadence": "cluster-cadence",
    "stream": "cluster-stream",
}
"""Each run's section of bench/RESULTS.md."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--config",
        type=Path,
        default=Path("configs/cluster_cpu.yaml"),
        help="the job's YAML (relative paths: to the repository)",
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), help="a named subset of the matrix")
    parser.add_argument("--shapes", type=lambda s: s.split(","), default=["2x4", "4x2"])
    parser.add_argument(
        "--links", type=lambda s: s.split(","), default=["100mbit", "400mbit", "1gbit"]
    )
    parser.add_argument("--every", type=lambda s: [int(x) for x in s.split(",")], default=[1, 10])
    parser.add_argument("--engines", type=lambda s: s.split(","), default=["dense", "sparse"])
    parser.add_argument("--group-sizes", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument(
        "--auto",
        type=lambda s: [x for x in s.split(",") if x],
        default=["model"],
        help="the advisor's pick to run too: model (empty: none)",
    )
    parser.add_argument(
        "--layouts", type=lambda s: s.split(","), help="2D layouts to run (default: both)"
    )
    parser.add_argument(
        "--switches",
        type=lambda s: [x for x in s.split(",") if x],
        default=[],
        help="sync options to measure one at a time, key=value each (hide=false)",
    )
    parser.add_argument(
        "--bounds",
        action="store_true",
        help="run each 2D strategy on unshaped links too (LINK=none: its compute bound)",
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--scratch", default="/tmp/sparse2d-cluster-bench")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-results-md", action="store_true")
    parser.add_argument("--render", action="store_true", help="re-render the stored JSON")
    parser.add_argument(
        "--repredict",
        action="store_true",
        help="with --render: the cost model's step again, on the topology the emulator "
        "writes now (the measurements stay as stored)",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the stored JSON's other cells (another shape or link)",
    )
    args = parser.parse_args(argv)
    if args.preset:
        for key, value in PRESETS[args.preset].items():
            setattr(args, key, value)
    name = f"cluster_{args.preset}" if args.preset else "cluster"
    marker = MARKERS[args.preset]
    if args.render:
        result = json.loads((args.out / f"{name}.json").read_text())
        stamp = stored_stamp(marker, args.out)
        if args.repredict:
            repredict(result)
    else:
        if os.geteuid() != 0:
            print("cluster_bench: needs root (launch/emulated_hosts.sh makes namespaces)")
            return 2
        result = measure(args)
        stamp = None
        stored = args.out / f"{name}.json"
        if args.merge and stored.exists():  # another shape or link measured earlier
            old = json.loads(stored.read_text())
            keys = {(c["hosts"], c["nproc"], c["link"], c["label"]) for c in result["cells"]}
            kept = [
                c
                for c in old["cells"]
                if (c["hosts"], c["nproc"], c["link"], c["label"]) not in keys
            ]
            result["cells"] = kept + result["cells"]
            result["machine"] = f"{old['machine']}; then {result['machine']}"
    args.out.mkdir(parents=True, exist_ok=True)
    plot(result, args.out / f"{name}.png")
    text = render(result, args.preset) + f"\n\nPlot: `bench/results/{name}.png`."
    publish(args, result, text, f"{name}.json", marker, stamp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
