"""Pick the sharding group size: the fastest estimated step among the ``L`` that fit memory."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from sparse2d.advisor.cost_model import AnalyticCostModel, Candidate
from sparse2d.advisor.group_layout import GroupLayoutPlanner, TorchRecGroupPlanner
from sparse2d.advisor.topology import ClusterTopology, byte_text
from sparse2d.advisor.workload import Workload
from sparse2d.errors import NoFitError
from sparse2d.mesh import divisors

_DEFAULT_PLANNER: GroupLayoutPlanner | None = None


def default_planner() -> GroupLayoutPlanner:
    """One process-wide planner, so layouts per ``L`` are computed once (they do not depend on G)."""
    global _DEFAULT_PLANNER
    if _DEFAULT_PLANNER is None:
        _DEFAULT_PLANNER = TorchRecGroupPlanner()
    return _DEFAULT_PLANNER


LAYOUTS = ("intra_host", "inter_host")


@dataclass(frozen=True, slots=True)
class Advice:
    world_size: int
    topology: str
    candidates: tuple[Candidate, ...]
    recommended: int | None
    reason: str
    recommended_layout: str | None = None
    """The replica layout of the recommended candidate."""

    def candidate(self, group_size: int) -> Candidate:
        return next(c for c in self.candidates if c.sharding_group_size == group_size)


def advise(
    workload: Workload,
    topology: ClusterTopology,
    planner: GroupLayoutPlanner | None = None,
) -> Advice:
    """Estimate every divisor ``L`` of the world size and recommend one (None: nothing fits).
    With ``workload.replica_layout == "auto"`` each ``L`` is priced in both layouts and keeps
    the faster (L=1 and L=T have one layout: their groups are the same either way)."""
    if workload.replica_layout != "auto":
        model = AnalyticCostModel(workload, topology, planner or default_planner())
        model.prepare(divisors(topology.world_size))
        candidates = tuple(model.estimate(L) for L in divisors(topology.world_size))
    else:
        candidates = _both_layouts(workload, topology, planner or default_planner())
    fitting = [c for c in candidates if c.fits]
    if not fitting:
        return Advice(topology.world_size, topology.name, candidates, None, "no L fits memory")
    best = min(fitting, key=lambda c: (c.step_s, -c.sharding_group_size))
    return Advice(
        topology.world_size,
        topology.name,
        candidates,
        best.sharding_group_size,
        _reason(best, candidates, topology),
        best.replica_layout,
    )


def _both_layouts(
    workload: Workload, topology: ClusterTopology, planner: GroupLayoutPlanner
) -> tuple[Candidate, ...]:
    """Each ``L``'s estimate in the faster replica layout (a fitting one first)."""
    models = [
        AnalyticCostModel(dataclasses.replace(workload, replica_layout=layout), topology, planner)
        for layout in LAYOUTS
    ]
    sizes = divisors(topology.world_size)
    groups = [(L, models[0].host_ranks(L)) for L in sizes]
    groups += [(L, models[1].host_ranks(L)) for L in sizes if L not in (1, topology.world_size)]
    planner.prepare(workload, groups, models[0].topology.compute_device)  # both layouts at once
    out = []
    for L in sizes:
        if L in (1, topology.world_size):
            out.append(models[0].estimate(L))
            continue
        both = [m.estimate(L) for m in models]
        out.append(min(both, key=lambda c: (not c.fits, c.step_s)))
    return tuple(out)


def _reason(best: Candidate, candidates: tuple[Candidate, ...], topology: ClusterTopology) -> str:
    smaller = [c for c in candidates if c.sharding_group_size < best.sharding_group_size]
    larger = [c for c in candidates if c.sharding_group_size > best.sharding_group_size]
    where = (
        f" ({best.replica_layout})" if 1 < best.sharding_group_size < topology.world_size else ""
    )
    parts = [
        f"L={best.sharding_group_size}{where} has the least estimated step ({_ms(best.step_s)})"
    ]
    tight = [c for c in smaller if not c.fits]
    if tight:
        c = max(tight, key=lambda c: c.sharding_group_size)
        parts.append(
            f"L={c.sharding_group_size} needs {_size(c.memory_per_rank_bytes)} per rank "
            f"> {_size(topology.usable_memory_bytes)} usable"
        )
    elif smaller:
        c = max(smaller, key=lambda c: c.sharding_group_size)
        parts.append(f"L={c.sharding_group_size} syncs {_ms(c.sync_s)}/step")
    if larger:
        c = min(larger, key=lambda c: c.sharding_group_size)
        parts.append(
            f"L={c.sharding_group_size} spends {_ms(c.a2a_s)} in all-to-all (vs {_ms(best.a2a_s)})"
        )
    return "; ".join(parts) + "."


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _size(nbytes: float) -> str:
    return byte_text(nbytes, " ")


def no_fit_message(advice: Advice, workload: Workload, topology: ClusterTopology) -> str:
    """Why nothing fits and what would, each fix with its numbers."""
    least = min(advice.candidates, key=lambda c: c.memory_per_rank_bytes)
    usable = topology.usable_memory_bytes
    state_total = sum(
        t.rows * (t.dim + workload.row_state_values(t.dim)) * workload.element_bytes
        for t in workload.tables
    )
    ranks_needed = math.ceil(state_total / usable)
    per_host = topology.ranks_per_host
    world_needed = max(ranks_needed, topology.world_size + 1)
    if world_needed > per_host:
        world_needed = math.ceil(world_needed / per_host) * per_host
    need_memory = least.memory_per_rank_bytes / (1 - topology.reserved_fraction)
    weights_only = workload.weight_bytes
    fixes = [
        f"use at least {world_needed} ranks (weights + optimizer state are "
        f"{_size(state_total)}; {_size(usable)} usable per rank needs >= {ranks_needed} ranks in "
        f"a group): --world-size {world_needed}",
        f"use devices with >= {_size(need_memory)} each (the best candidate, L="
        f"{least.sharding_group_size}, needs {_size(least.memory_per_rank_bytes)} per rank): "
        f"--topology h200_8x or topology device_memory_bytes={int(math.ceil(need_memory))}",
    ]
    if workload.optimizer != "sgd":
        sgd_state = dataclasses.replace(workload, optimizer="sgd")
        saved = state_total - sum(
            t.rows * (t.dim + sgd_state.row_state_values(t.dim)) * workload.element_bytes
            for t in workload.tables
        )
        fixes.append(
            f"use optimizer.sparse.kind=sgd (saves {_size(saved)} of optimizer state in total, "
            f"{_size(saved / max(1, topology.world_size))} per rank at L={topology.world_size})"
        )
    fixes.append(
        f"shrink the tables: their weights alone are {_size(weights_only)} "
        f"({_size(weights_only / topology.world_size)} per rank even at L={topology.world_size})"
    )
    lines = [
        f"No sharding group size fits {_size(usable)} usable per rank "
        f"({topology.name}, world {topology.world_size}); the smallest need is "
        f"{_size(least.memory_per_rank_bytes)} per rank at L={least.sharding_group_size}. Fixes:"
    ]
    lines += [f"  {i}. {fix}" for i, fix in enumerate(fixes, 1)]
    return "\n".join(lines)


def recommend_group_size(
    workload: Workload, topology: ClusterTopology, planner: GroupLayoutPlanner | None = None
) -> int:
    """The advisor's ``L`` for ``sharding_group_size="auto"``; ``NoFitError`` when none fits."""
    advice = advise(workload, topology, planner)
    if advice.recommended is None:
        raise NoFitError(no_fit_message(advice, workload, topology))
    return advice.recommended
