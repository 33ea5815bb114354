"""Per-step cost of one candidate sharding group size ``L`` (DESIGN.md section 3).

For a world of ``T`` ranks split into ``G = T / L`` groups, on each candidate TorchRec layout
of one group (``group_layout``: TorchRec's proposals plus one per sharding type, so the
sharding type of a table changes with ``L`` where that is cheaper), the terms of
``cost_terms`` (one function each, constants from the topology's YAML):

* memory per rank: shard weights + fused optimizer state + TorchRec's I/O buffer estimate,
  most loaded rank; FULLY_SHARDED keeps ``1/G`` of weights and state;
* output all-to-all (pooled embeddings forward, gradients backward) per sharding type, split
  into intra- and inter-host bytes, at the qcomm wire precision of each direction, plus the
  CPU work per all-to-all value that no wire precision saves; the row-wise reduce-scatter
  part at its own bandwidth;
* input all-to-all of the ids: serial, or overlapped with the previous step when pipelined;
* replica sync per step: a dense or touched-rows all-reduce plus a fixed cost and the NaN/inf
  vote, over ``sync_every``; with ``hide`` its all-reduce runs beside the next input dist
  until the next lookup lands it (a host link carries its bytes meanwhile; the cores hide
  theirs by ``comm_overlap``), a stream's fragment beside the whole next step; the rings on a
  host's link take the sum of their bytes; FULLY_SHARDED's three collectives every step;
* lookup compute of the most loaded rank (stragglers): bytes streamed plus the distinct rows
  its fused optimizer updates (Zipf-expected over the group's ids), and the dense part.

The step is ``compute + output a2a + exposed input a2a + exposed sync + dense + overhead``.
Every per-rank term is taken at the most loaded rank of the real plan.
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from sparse2d.advisor import cost_terms as ct
from sparse2d.advisor.cost_terms import ID_BYTES
from sparse2d.advisor.group_layout import GroupLayout, GroupLayoutPlanner, PlacedShard
from sparse2d.advisor.topology import ClusterTopology
from sparse2d.advisor.workload import Workload
from sparse2d.mesh import rank_layout, replica_groups

TYPE_ORDER = (
    "table_wise",
    "column_wise",
    "table_column_wise",
    "row_wise",
    "table_row_wise",
    "grid_shard",
)
"""Among equal estimates the simpler sharding wins (fewer collectives, fewer groups)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """The estimate for one ``L``."""

    sharding_group_size: int
    num_replicas: int
    fits: bool
    memory_per_rank_bytes: int
    """Most loaded rank: weights + optimizer state + I/O buffers."""
    state_per_rank_bytes: int
    """Most loaded rank: weights + optimizer state only."""
    memory_imbalance: float
    a2a_bytes: int
    a2a_s: float
    sync_bytes: int
    """Bytes one rank all-reduces per sync."""
    sync_s: float
    """Sync time per step (a sync's time / ``sync_every``)."""
    compute_s: float
    imbalance: float
    """Lookup load of the most loaded rank over the mean (stragglers)."""
    dense_s: float
    step_s: float
    proposal: str
    sharding_types: tuple[tuple[str, int], ...] = ()
    """(sharding type, tables) of the chosen layout."""
    terms: tuple[tuple[str, float], ...] = ()
    """Every term of ``step_s`` (seconds), named, in the order they are added."""
    sync_kind: str = "none"
    """How the replica sync runs: ``none`` (G=1), ``dense``, ``sparse`` (touched rows) or
    ``fully_sharded``."""
    replica_layout: str = "intra_host"
    """The replica layout priced (the faster of both where the workload says ``auto``)."""
    sync_modes: tuple[tuple[str, float], ...] = ()
    """The replica sync per step as a ``burst`` (every row at once, every ``sync_every``
    steps) and ``streamed`` (one fragment per step behind the next step): both priced, so a
    reader sees which suits the links (``sync_s`` is the workload's own)."""
    host_link_bytes: float = 0.0
    """Payload bytes one host sends across its link per step (lookup all-to-alls, replica
    sync over ``sync_every``, dense all-reduce): what a host's interface counter reads, less
    the framing; ``host_link_terms`` splits it."""
    host_link_terms: tuple[tuple[str, float], ...] = ()

    def term(self, name: str) -> float:
        return dict(self.terms)[name]

    def as_json(self) -> dict[str, object]:
        return {
            "sharding_group_size": self.sharding_group_size,
            "replica_layout": self.replica_layout,
            "fits": self.fits,
            "memory_per_rank_bytes": self.memory_per_rank_bytes,
            "a2a_s": self.a2a_s,
            "sync_s": self.sync_s,
            "compute_s": self.compute_s,
            "imbalance": self.imbalance,
            "step_s": self.step_s,
            "sharding_types": dict(self.sharding_types),
            "terms": dict(self.terms),
            "sync_kind": self.sync_kind,
            "sync_modes": dict(self.sync_modes),
            "host_link_bytes": self.host_link_bytes,
            "host_link_terms": dict(self.host_link_terms),
        }


class CostModel(ABC):
    """Estimates one candidate group size."""

    @abstractmethod
    def estimate(self, group_size: int) -> Candidate: ...


@functools.lru_cache(maxsize=4096)
def _zipf_buckets(rows: int, exponent: float, buckets: int) -> tuple[Any, Any]:
    """(rows per bucket, probability of one row of the bucket): the same for every draw count,
    so it is built once per table shape (the advisor asks ~40k times for a large config)."""
    import numpy as np

    if rows <= 4 * buckets:
        i = np.arange(1, rows + 1, dtype=np.float64)
        count = np.ones_like(i)
    else:
        edges = np.unique(np.geomspace(1, rows + 1, buckets).astype(np.int64))
        count = np.diff(edges).astype(np.float64)
        i = np.sqrt(edges[:-1] * (edges[1:] - 1.0).clip(min=edges[:-1]))
    weight = i**-exponent
    p = weight / float((weight * count).sum())
    count.flags.writeable = p.flags.writeable = False  # shared by every caller
    return count, p


def zipf_unique(rows: int, draws: float, exponent: float, buckets: int = 2048) -> float:
    """Expected distinct rows among ``draws`` ids with ``P(i) ~ i^-exponent`` over ``rows``.

    ``sum_i 1 - exp(-draws * p_i)`` (Poisson approximation), summed exactly for small
    tables and over geometric buckets of ``i`` for large ones (within ~1%).
    """
    import numpy as np

    if draws <= 0:
        return 0.0
    count, p = _zipf_buckets(int(rows), float(exponent), int(buckets))
    return float((count * -np.expm1(-draws * p)).sum())


def shard_state_bytes(shard: PlacedShard, workload: Workload, replicas: int) -> tuple[int, int]:
    """(weight bytes held, optimizer state bytes) of one shard on its rank."""
    eb = workload.element_bytes
    weights = shard.rows * shard.cols * eb
    state = shard.rows * workload.row_state_values(shard.cols) * eb
    if workload.sharding_strategy == "fully_sharded":  # sparse2d slices the state too
        return math.ceil(weights / replicas), math.ceil(state / replicas)
    return weights, state


def _peers(topology: ClusterTopology, ranks: list[int]) -> tuple[int, int]:
    """(peers of ``ranks[0]`` on its host, peers elsewhere) within ``ranks``."""
    host = topology.host_of(ranks[0])
    local = sum(1 for r in ranks[1:] if topology.host_of(r) == host)
    return local, len(ranks) - 1 - local


def _allreduce_s(nbytes: float, members: list[int], topology: ClusterTopology) -> float:
    """Ring all-reduce of ``nbytes`` per rank over ``members`` (bottleneck link)."""
    local, remote = _peers(topology, members) if members else (0, 0)
    return ct.allreduce_s(nbytes, len(members), remote > 0, topology, local + 1)


def _type_rank(candidate: Candidate) -> int:
    return max(
        (TYPE_ORDER.index(t) for t, _ in candidate.sharding_types if t in TYPE_ORDER), default=0
    )


@dataclass(slots=True)
class _RankLoads:
    """Per rank of one group (index = rank in the group): bytes held, looked up, synced and
    sent; ``*_total`` over the group; ``types``: sharding type -> {table: shards}."""

    memory: list[float]
    state: list[float]
    synced: list[float]
    lookup: list[float]
    full: list[float]
    touched: list[float]
    links: list[ct.LinkBytes]  # all-to-all part of the output dist
    scatters: list[ct.LinkBytes]  # its reduce-scatter part
    ids_send: list[float]
    ids_recv: list[float]
    host_out: list[float]  # received output values served from each host (by first rank)
    own_out: list[float]
    out_total: float = 0.0
    ids_total: float = 0.0
    types: dict[str, dict[str, int]] = field(default_factory=dict)

    @classmethod
    def empty(cls, L: int) -> _RankLoads:
        zeros = [[0.0] * L for _ in range(10)]
        links = [ct.LinkBytes() for _ in range(L)]
        scatters = [ct.LinkBytes() for _ in range(L)]
        return cls(*zeros[:6], links, scatters, *zeros[6:])


class AnalyticCostModel(CostModel):
    """The terms of ``cost_terms`` over every candidate TorchRec layout of a group."""

    def __init__(
        self, workload: Workload, topology: ClusterTopology, planner: GroupLayoutPlanner
    ) -> None:
        self.workload, self.planner = workload, planner
        self.topology = ct.on_shared_cores(topology)
        self._by_name = {t.name: t for t in workload.tables}

    def host_ranks(self, group_size: int) -> int:
        """Ranks of one sharding group on its first rank's host."""
        group = rank_layout(self.topology.world_size, group_size, self.workload.replica_layout)[0]
        return _peers(self.topology, group)[0] + 1

    def prepare(self, group_sizes: list[int]) -> None:
        """Let the planner make the layouts of ``group_sizes`` ahead (in parallel, if it can)."""
        groups = [(L, self.host_ranks(L)) for L in group_sizes]
        self.planner.prepare(self.workload, groups, self.topology.compute_device)

    def layouts(self, group_size: int) -> list[Candidate]:
        """The estimate of every candidate layout at ``group_size`` (``--explain``)."""
        w, topo = self.workload, self.topology
        replicas = topo.world_size // group_size
        group = rank_layout(topo.world_size, group_size, w.replica_layout)[0]
        layouts = self.planner.layouts(
            w, group_size, self.host_ranks(group_size), topo.compute_device
        )
        return [self._estimate(layout, replicas, group) for layout in layouts]

    def estimate(self, group_size: int) -> Candidate:
        results = self.layouts(group_size)
        fitting = [c for c in results if c.fits]
        if fitting:  # 0.1% ties go to the simpler sharding
            least = min(c.step_s for c in fitting)
            near = [c for c in fitting if c.step_s <= least * 1.001]
            return min(near, key=lambda c: (_type_rank(c), c.step_s))
        return min(results, key=lambda c: c.memory_per_rank_bytes)

    def _estimate(self, layout: GroupLayout, replicas: int, group: list[int]) -> Candidate:
        w, topo = self.workload, self.topology
        L, B = layout.group_size, w.batch_size_per_rank
        local_peers, remote_peers = _peers(topo, group)
        loads = self._loads(layout, replicas, local_peers + 1)
        out_a2a, ids_a2a, a2a_bytes = self._all_to_alls(loads, local_peers, remote_peers)
        busiest = max(ct.lookup_s(loads.lookup[r], loads.touched[r], topo) for r in range(L))
        compute_s = busiest + 6 * w.dense_params * B / topo.dense_flops
        ids_exposed = (
            ct.exposed_s(ids_a2a, compute_s + out_a2a, topo.comm_overlap) if w.pipeline else ids_a2a
        )
        dense_s = _allreduce_s(w.dense_params * 4, list(range(topo.world_size)), topo)
        synced = loads.synced
        shard = max(synced)  # the slowest ring's; the rings on a host's link carry the mean
        mean = sum(synced) / L
        # hidden: from the end of the backward to the next lookup, which lands it; beside the
        # next input dist only (the dense optimizer step and the data are not priced)
        window = ids_a2a if w.hide else None
        sync_s, sync_kind = self._sync_s(shard, mean, max(loads.full), replicas, L, window)
        modes: tuple[tuple[str, float], ...] = ()
        if sync_kind in ("dense", "sparse") and w.sync_every > 1:
            beside = compute_s + out_a2a + ids_exposed + dense_s if w.hide else 0.0
            streamed = self._streamed_s(shard, mean, replicas, L, beside)
            modes = (("burst", sync_s), ("streamed", streamed))
            sync_s = streamed if w.stream else sync_s
        mem = max(loads.memory)
        link_terms = self._host_link_terms(loads, local_peers, remote_peers, replicas, L)
        terms = (
            ("compute", compute_s),
            ("output_a2a", out_a2a),
            ("input_a2a", ids_exposed),
            ("sync", sync_s),
            ("dense_allreduce", dense_s),
            ("overhead", topo.step_overhead_s),
        )
        return Candidate(
            sharding_group_size=L,
            num_replicas=replicas,
            fits=mem <= topo.usable_memory_bytes,
            memory_per_rank_bytes=int(mem),
            state_per_rank_bytes=int(max(loads.state)),
            memory_imbalance=ct.straggler(loads.memory),
            a2a_bytes=int(a2a_bytes),
            a2a_s=out_a2a + ids_exposed,
            sync_bytes=int(max(synced)),
            sync_s=sync_s,
            compute_s=compute_s,
            imbalance=ct.straggler(
                [ct.lookup_s(b, n, topo) for b, n in zip(loads.lookup, loads.touched)]
            ),
            dense_s=dense_s,
            step_s=sum(v for _, v in terms),
            proposal=layout.proposal,
            sharding_types=tuple(sorted((k, sum(v.values())) for k, v in loads.types.items())),
            terms=terms,
            sync_kind=sync_kind,
            replica_layout=w.replica_layout,
            sync_modes=modes,
            host_link_bytes=sum(v for _, v in link_terms),
            host_link_terms=link_terms,
        )

    def _host_link_terms(
        self, loads: _RankLoads, local_peers: int, remote_peers: int, replicas: int, L: int
    ) -> tuple[tuple[str, float], ...]:
        """Bytes one host sends across its link per step, by collective: each of its ranks'
        remote share of the output all-to-all (values forward, gradients backward: what it
        serves remote ranks plus what it receives from them, sent back) and of its ids; each
        ring all-reduce whose members span hosts crosses a host's link once per ring,
        ``2 (n-1)/n`` times its bytes, with ``ranks_per_host / members there`` rings side by
        side (the replica sync over ``sync_every``; the dense gradients over the world).
        Mean over the group's ranks (every host holds the same mix of them): each ring
        carries its own member's shard, so a host's sync bytes are the sum of its ranks'
        shards, not ``rings`` times the largest (which prices the sync's time: the slowest
        ring; 26 tables over 4 ranks hold 7, 7, 6, 6: the largest overstates a host's bytes
        by 8%)."""
        w, topo = self.workload, self.topology
        per_host = min(topo.ranks_per_host, topo.world_size)
        forward, backward = ct.qcomm_bytes(w.qcomm_forward), ct.qcomm_bytes(w.qcomm_backward)
        a2a = ids = 0.0
        if L > 1:
            for r in range(L):
                lb, sc = loads.links[r], loads.scatters[r]
                a2a += (lb.send_inter + sc.send_inter) * forward
                a2a += (lb.recv_inter + sc.recv_inter) * backward
                ids += (loads.ids_send[r] + loads.ids_total) * remote_peers / (L - 1)
        sync = 0.0
        if replicas > 1:
            members = replica_groups(topo.world_size, L, w.replica_layout)[0]
            local, remote = _peers(topo, members)
            if remote:
                rings = per_host / (local + 1)
                ring = 2 * (replicas - 1) / replicas * sum(loads.synced) / L
                sync = rings * ring / w.sync_every
        dense = 0.0
        if topo.world_size > per_host:
            dense = 2 * (topo.world_size - 1) / topo.world_size * w.dense_params * 4
        return (
            ("output_a2a", a2a / L * per_host),
            ("input_a2a", ids / L * per_host),
            ("sync", sync),
            ("dense_allreduce", dense),
        )

    def _loads(self, layout: GroupLayout, replicas: int, H: int) -> _RankLoads:
        """What each rank of the group holds, looks up, syncs and sends, shard by shard."""
        w = self.workload
        L, B, eb = layout.group_size, w.batch_size_per_rank, w.element_bytes
        loads = _RankLoads.empty(L)
        crossover = self._auto_crossover(L)
        for rank, shards in enumerate(layout.per_rank()):
            for s in shards:
                t, n = self._by_name[s.table], s.count
                loads.types.setdefault(s.sharding_type, {})[s.table] = n
                weights, opt = shard_state_bytes(s, w, replicas)
                loads.state[rank] += n * (weights + opt)
                loads.memory[rank] += n * (weights + opt + s.io_bytes)
                loads.synced[rank] += n * self._synced_bytes(s, replicas, crossover)
                loads.full[rank] += n * s.rows * (s.cols + w.row_state_values(s.cols)) * eb
                share = s.rows / t.rows  # 0 for a row-wise shard left empty (rows < L)
                table_ids = L * B * t.features * t.pooling_factor  # the group's ids into t
                ids = table_ids * share  # group ids hitting s
                loads.lookup[rank] += n * ids * s.cols * eb
                loads.touched[rank] += n * self._touched_rows(t.rows, table_ids) * share
                values = B * t.features * s.cols  # one rank's samples, these columns
                scattered = ct.scattered_values(s.sharding_type, values, L, H)
                loads.links[rank].add(ct.output_values_sent(s.sharding_type, values, L, H), n)
                loads.links[rank].add(scattered, -n)
                loads.scatters[rank].add(scattered, n)
                if s.sharding_type in ct.TW_LIKE:  # others receive from this holder
                    served = n * values
                elif s.sharding_type in ct.HOST_RW_LIKE:  # the host serves it, 1/H each
                    served = n * values / H
                else:  # row-wise: symmetric, all of it in its reduce-scatter
                    served = 0.0
                loads.out_total += served
                loads.host_out[rank // H * H] += served
                loads.own_out[rank] += served
                loads.ids_recv[rank] += n * (L - 1) / L * ids * ID_BYTES
                loads.ids_total += n * ids / L * ID_BYTES
                loads.ids_send[rank] -= n * ids / L * ID_BYTES  # its own samples never leave
        return loads

    def _all_to_alls(
        self, loads: _RankLoads, local_peers: int, remote_peers: int
    ) -> tuple[float, float, float]:
        """Seconds of the output all-to-all (values forward, gradients backward) and of the
        input all-to-all (splits, then ids) at the slowest rank, and the most bytes a rank
        moves in them."""
        w, topo, L, H = self.workload, self.topology, len(loads.memory), local_peers + 1
        wire = ct.qcomm_bytes(w.qcomm_forward) + ct.qcomm_bytes(w.qcomm_backward)
        out_s, a2a_bytes, ids_s = [0.0] * L, [0.0] * L, [0.0] * L
        for r in range(L):
            here = loads.host_out[r // H * H]
            lb = loads.links[r]
            lb.recv_intra += here - loads.own_out[r]
            lb.recv_inter += loads.out_total - here
            sc = loads.scatters[r]
            out_s[r] = ct.link_time_s(lb.intra * wire, lb.inter * wire, topo)
            out_s[r] += ct.output_values_s(2 * (lb.intra + lb.inter), topo)
            out_s[r] += ct.scatter_s(sc.intra * wire, sc.inter * wire, topo)
            ids_bytes = max(loads.ids_send[r] + loads.ids_total, loads.ids_recv[r])
            ids_s[r] = self._split_s(ids_bytes, local_peers, remote_peers)
            a2a_bytes[r] = (lb.intra + lb.inter + sc.intra + sc.inter) * wire + ids_bytes
        if L > 1:
            out_a2a = max(out_s) + ct.a2a_latency_s(remote_peers, 2, topo)
            ids_a2a = max(ids_s) + ct.a2a_latency_s(remote_peers, 2, topo)
        else:
            out_a2a = ids_a2a = 0.0
        return out_a2a, ids_a2a, max(a2a_bytes)

    def _touched_rows(self, rows: int, ids: float) -> float:
        """Expected distinct rows among one step's ``ids`` into a table of ``rows`` (only
        when the topology prices row updates: the advisor asks this ~40k times at scale)."""
        if not self.topology.row_update_s:
            return 0.0
        return zipf_unique(rows, ids, self.workload.zipf_exponent)

    def _split_s(self, nbytes: float, local: int, remote: int) -> float:
        """Bandwidth time of an all-to-all whose peers split ``local``/``remote``."""
        peers = local + remote
        if not peers:
            return 0.0
        return ct.link_time_s(nbytes * local / peers, nbytes * remote / peers, self.topology)

    def _sync_s(
        self,
        shard_bytes: float,
        link_bytes: float,
        full: float,
        replicas: int,
        L: int,
        hidden_beside: float | None = None,
    ) -> tuple[float, str]:
        """Replica sync per step and which mechanism runs it. ``link_bytes``: the mean shard
        of the rings side by side on a host's link (``allreduce_s``). ``hidden_beside``
        (``hide``): the seconds of work one sync's all-reduce runs beside before the next
        lookup waits for it, once per sync (``hidden_allreduce_s``); its fixed cost and
        vote are the sync call's own and are paid."""
        w, topo = self.workload, self.topology
        if replicas <= 1:
            return 0.0, "none"
        members = replica_groups(topo.world_size, L, w.replica_layout)[0]
        local, remote = _peers(topo, members)
        world_remote = topo.world_size > topo.ranks_per_host
        if w.sharding_strategy == "fully_sharded":
            return ct.fully_sharded_s(
                full, replicas, remote > 0, topo
            ) + topo.sync_overhead_s, "fully_sharded"
        if hidden_beside is None:
            per_sync = ct.allreduce_s(
                shard_bytes, replicas, remote > 0, topo, local + 1, link_bytes
            )
        else:
            per_sync = ct.hidden_allreduce_s(
                shard_bytes, replicas, remote > 0, topo, local + 1, hidden_beside, link_bytes
            )
        per_sync += topo.sync_overhead_s
        kind = "dense" if w.engine == "dense" else "sparse"
        if w.check_finite:
            per_sync += ct.vote_s(topo.world_size, world_remote, topo)
        return per_sync / w.sync_every, kind

    def _streamed_s(
        self, shard_bytes: float, link_bytes: float, replicas: int, L: int, beside_s: float
    ) -> float:
        """A streamed sync per step: ``1 / sync_every`` of a sync's bytes every step, its wire
        time behind ``beside_s`` of the next step's work, its fixed cost and NaN/inf vote paid
        every step."""
        w, topo = self.workload, self.topology
        members = replica_groups(topo.world_size, L, w.replica_layout)[0]
        local, remote = _peers(topo, members)
        fragment, on_link = shard_bytes / w.sync_every, link_bytes / w.sync_every
        step_s = ct.hidden_allreduce_s(
            fragment, replicas, remote > 0, topo, local + 1, beside_s, on_link
        )
        step_s += topo.sync_overhead_s
        if w.check_finite:
            step_s += ct.vote_s(topo.world_size, topo.world_size > topo.ranks_per_host, topo)
        return step_s

    def _auto_crossover(self, L: int) -> float:
        """Union fraction of a shard above which ``engine="auto"`` syncs it whole. The
        engine takes the cheaper mode by its measured costs, ``(wire + copy) / (wire +
        index)`` per byte (``sync.engines.cost.LinkCosts.crossover``): where the replica
        ring crosses a host link the wire dominates both copies, and the cheaper mode is the
        one that sends fewer bytes, touched rows (each with ``ID_BYTES`` of agreement)
        against the whole shard. Elsewhere ``Workload.sparse_crossover`` (measured on
        loopback, where the indexed copies weigh: ``bench/sparse_sync_bench.py``)."""
        w, topo = self.workload, self.topology
        if not topo.host_link_bw or topo.world_size // L <= 1:
            return w.sparse_crossover
        members = replica_groups(topo.world_size, L, w.replica_layout)[0]
        if not _peers(topo, members)[1]:
            return w.sparse_crossover
        return 1.0  # a row's agreement is priced in the sparse bytes: compared there

    def _synced_bytes(self, s: PlacedShard, replicas: int, crossover: float) -> float:
        """Bytes of shard ``s`` one sync all-reduces (dense or expected touched rows)."""
        w = self.workload
        if replicas <= 1:
            return 0.0
        row = s.cols if w.sharding_strategy != "fully_sharded" else 0
        if w.include_optimizer_state:
            row += w.row_state_values(s.cols)
        dense = s.rows * row * w.element_bytes
        if w.engine == "dense" or row == 0:
            return float(dense)
        t = self._by_name[s.table]
        draws = self.topology.world_size * w.batch_size_per_rank * t.features * t.pooling_factor
        union = zipf_unique(t.rows, draws * w.sync_every, w.zipf_exponent) * s.rows / t.rows
        sparse = union * (row * w.element_bytes + ID_BYTES)
        if w.engine == "auto" and (union > crossover * s.rows or sparse >= dense):
            return float(dense)
        return sparse
