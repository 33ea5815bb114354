"""How a workload's cost grows with the world: 1D against the advisor's best 2D, per world size.

The same cost model as ``sparse2d plan`` (``search.advise``) at each world size, weak scaling
(``batch_size_per_rank`` fixed), with two bounds per layout drawn beside its step: the
compute bound (the step if every collective were free: lookups and the dense part) and the
link bound (the step if only the bytes a host sends across its link counted, at its link's
rate). ``sparse2d plan --forecast`` prints it for a user's config; ``bench/scaling_sim.py``
plots it beside the emulated cluster's measured points (``bench/scaling_bench.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sparse2d.advisor.cost_model import Candidate
from sparse2d.advisor.group_layout import GroupLayoutPlanner
from sparse2d.advisor.search import advise
from sparse2d.advisor.topology import ClusterTopology
from sparse2d.advisor.workload import Workload
from sparse2d.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Point:
    """One world size: 1D (L = world) and the recommended L, with their bounds."""

    world: int
    batch_per_rank: int
    host_link_bw: float
    """Bytes per second one host's link carries (the link bound's rate)."""
    one_d: Candidate
    best: Candidate | None
    """The advisor's recommendation; None where no L fits memory."""

    def samples_per_rank(self, candidate: Candidate | None) -> float | None:
        """Samples per second per rank of a candidate's predicted step."""
        return None if candidate is None else self.batch_per_rank / candidate.step_s

    def compute_bound(self, candidate: Candidate) -> float:
        """Samples/s per rank if only compute counted (no collective costs time)."""
        return self.batch_per_rank / candidate.compute_s

    def link_bound(self, candidate: Candidate) -> float | None:
        """Samples/s per rank if only the host link counted; None where nothing crosses."""
        if not candidate.host_link_bytes or not self.host_link_bw:
            return None
        return self.batch_per_rank / (candidate.host_link_bytes / self.host_link_bw)

    def as_json(self) -> dict[str, object]:
        out: dict[str, object] = {"world_size": self.world}
        for name, c in (("1d", self.one_d), ("best", self.best)):
            if c is None:
                out[name] = None
                continue
            out[name] = {
                "sharding_group_size": c.sharding_group_size,
                "replica_layout": c.replica_layout,
                "step_s": c.step_s,
                "samples_per_s_per_rank": self.samples_per_rank(c),
                "compute_bound_per_rank": self.compute_bound(c),
                "link_bound_per_rank": self.link_bound(c),
                "host_link_bytes_per_step": c.host_link_bytes,
                "fits": c.fits,
                "terms": dict(c.terms),
            }
        return out


def link_rate(topology: ClusterTopology) -> float:
    """Bytes per second one host's link carries: its shaped link, else its ranks' inter-host
    bandwidth together; 0 on one host."""
    if topology.hosts <= 1:
        return 0.0
    return topology.host_link_bw or topology.inter_host_bw * topology.ranks_per_host


def forecast(
    workload: Workload,
    topology_at: Callable[[int], ClusterTopology],
    worlds: Iterable[int],
    planner: GroupLayoutPlanner | None = None,
) -> list[Point]:
    """The cost model at each of ``worlds`` (``topology_at(world)`` its cluster)."""
    points = []
    for world in worlds:
        if world < 1:
            raise ConfigError(f"a forecast's world size must be >= 1 (got {world}).")
        topology = topology_at(world)
        advice = advise(workload, topology, planner)
        best = advice.candidate(advice.recommended) if advice.recommended else None
        points.append(
            Point(
                world=world,
                batch_per_rank=workload.batch_size_per_rank,
                host_link_bw=link_rate(topology),
                one_d=advice.candidate(world),
                best=best,
            )
        )
    return points


def format_forecast(points: list[Point]) -> str:
    """One row per world: 1D and the best L, samples/s per rank (predicted step) with their
    compute and link bounds, and the bytes a host sends across its link per step."""

    def cell(p: Point, c: Candidate | None) -> list[str]:
        if c is None:
            return ["no fit", "-", "-", "-"]
        link = p.link_bound(c)
        return [
            f"{p.samples_per_rank(c):,.0f} ({c.step_s * 1e3:,.0f} ms)",
            f"{p.compute_bound(c):,.0f}",
            "-" if link is None else f"{link:,.0f}",
            f"{c.host_link_bytes / 1e6:,.2f}",
        ]

    head = (
        "| ranks | 1D samples/s/rank (step) | 1D compute bound | 1D link bound | 1D MB/host/step "
        "| best L | best samples/s/rank (step) | best compute bound | best link bound "
        "| best MB/host/step | best / 1D |"
    )
    lines = [head, "|" + "---:|" * 11]
    for p in points:
        best = p.best
        ratio = f"{p.one_d.step_s / best.step_s:.2f}x" if best is not None and best.step_s else "-"
        label = "-" if best is None else f"{best.sharding_group_size} {best.replica_layout}"
        row = [str(p.world), *cell(p, p.one_d), label, *cell(p, best), ratio]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)
