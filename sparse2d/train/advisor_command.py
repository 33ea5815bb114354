"""``sparse2d plan``: the group-size advisor for a trainer config (no process group, no GPU).

Prints the cost table over every divisor ``L`` of the world size and the recommended
``parallel.sharding_group_size`` (the options below; docs/advisor.md). Exit status 1, with
numbered fixes, when no ``L`` fits device memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from sparse2d.advisor.forecast import forecast, format_forecast
from sparse2d.advisor.group_layout import TorchRecGroupPlanner
from sparse2d.advisor.render import explain, format_table, to_json
from sparse2d.advisor.search import advise, no_fit_message
from sparse2d.advisor.topology import ClusterTopology, load_topology
from sparse2d.errors import ConfigError
from sparse2d.train.advisor_workload import workload_from_config
from sparse2d.train.config import Config, load_config


def default_jobs() -> int:
    """Processes that plan the candidate ``L``: the cores this process may use, at most 4."""
    usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return max(1, min(4, len(usable) if usable is not None else os.cpu_count() or 1))


def default_topology_name(cfg: Config) -> str:
    return "cpu_gloo" if cfg.device == "cpu" else "h100_8x"


def topology_for(
    cfg: Config, world_size: int, name: str | None = None, overrides: list[str] | None = None
) -> ClusterTopology:
    return load_topology(name or default_topology_name(cfg), world_size, overrides or [])


def _worlds(text: str) -> list[int]:
    """``--forecast``'s world sizes: whole numbers >= 1, comma-separated."""
    try:
        worlds = [int(x) for x in text.split(",")]
    except ValueError:
        worlds = []
    if not worlds or min(worlds) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give world sizes >= 1, comma-separated (e.g. 1024,4096)"
        )
    return worlds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sparse2d plan", description=__doc__)
    parser.add_argument("--config", required=True, help="trainer YAML config")
    parser.add_argument("--world-size", type=int, default=8, help="ranks in the job (default 8)")
    parser.add_argument(
        "--topology", help="preset (h100_8x, h200_8x, cpu_gloo) or YAML file; default by device"
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="topology field override"
    )
    parser.add_argument(
        "--sharding-strategy", choices=("default", "fully_sharded"), default="default"
    )
    parser.add_argument(
        "--qcomm",
        default="fp32",
        metavar="FWD[,BWD]",
        help="all-to-all wire precision (fp32, fp16, bf16, fp8, int8), forward[,backward]",
    )
    parser.add_argument("--explain", type=int, metavar="L", help="why this L loses, term by term")
    parser.add_argument(
        "--jobs",
        type=int,
        default=default_jobs(),
        metavar="N",
        help="plan the candidate L in N processes (default: the usable cores, at most 4)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--forecast",
        type=_worlds,
        default=[],
        metavar="N[,N...]",
        help="also forecast 1D and the best L at these world sizes (e.g. 1024,4096)",
    )
    parser.add_argument("overrides", nargs="*", help="dotted.key=value config overrides")
    args = parser.parse_args(argv)
    try:
        if args.world_size < 1:
            raise ConfigError(f"--world-size {args.world_size} must be >= 1.")
        if args.jobs < 1:
            raise ConfigError(f"--jobs {args.jobs} must be >= 1.")
        cfg = load_config(args.config, args.overrides)
        topology = topology_for(cfg, args.world_size, args.topology, args.set)
        workload = workload_from_config(cfg)
        fwd, _, bwd = args.qcomm.partition(",")
        workload = dataclasses.replace(
            workload,
            sharding_strategy=args.sharding_strategy,
            qcomm_forward=fwd,
            qcomm_backward=bwd or fwd,
        )
        advice = advise(workload, topology, TorchRecGroupPlanner(workers=args.jobs))
        text = to_json(advice) if args.json else format_table(advice)
        if args.explain is not None:
            text += "\n" + explain(advice, args.explain)
        if args.forecast:
            points = forecast(
                workload,
                lambda world: topology_for(cfg, world, args.topology, args.set),
                args.forecast,
                TorchRecGroupPlanner(workers=args.jobs),
            )
            if args.json:
                merged = json.loads(text)
                merged["forecast"] = [p.as_json() for p in points]
                text = json.dumps(merged)
            else:
                text += (
                    "\n\nForecast (weak scaling, this topology; samples/s per rank, bounds: "
                    "compute only, host link only):\n" + format_forecast(points)
                )
    except ConfigError as error:
        print(f"sparse2d plan: {error}", file=sys.stderr)
        return 1
    print(text)
    if advice.recommended is None:
        print(f"sparse2d plan: {no_fit_message(advice, workload, topology)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
