"""Per-step cost of one candidate sharding group size ``L`` (DESIGN.md section 3).

For a world of ``T`` ranks split into ``G = T / L`` groups, from the group's TorchRec
layout (``group_layout``) and the cluster (``topology``):

* memory per rank: shard weights + every fused optimizer state + TorchRec's I/O buffer
  estimate; the most loaded rank counts (imbalance included). FULLY_SHARDED keeps
  ``1/G`` of the weights and of the optimizer state (``sparse2d.sync.fully_sharded``).
* lookup all-to-all per rank per step: every shard's holder sends its pooled output for
  the ``L - 1`` other ranks' samples (``(L-1) * B * features * cols`` values, exact for
  table-, column- and row-wise), the same again for the gradients, plus the ids.
* replica sync per step: all-reduce of the synced shard bytes plus a fixed per-sync cost,
  ``(2 (G-1)/G * bytes / bandwidth + latency steps * alpha + overhead) / sync_every``; the sparse engine syncs only the
  expected rows touched by any replica in the interval (Zipf ids spread by hashing).
* lookup compute per rank (bytes streamed / lookup bandwidth) and its max/mean.
* dense: MLP FLOPs and the data-parallel all-reduce of dense gradients (same for all L).

Every formula is per rank and uses the most loaded rank, because a group steps at the
pace of its slowest member.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

from sparse2d.mesh import rank_layout, replica_groups
from sparse2d.planner.group_layout import GroupLayout, GroupLayoutPlanner, PlacedShard
from sparse2d.planner.topology import ClusterTopology
from sparse2d.planner.workload import Workload

ID_BYTES = 8  # int64 ids in the input all-to-all


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

    def as_json(self) -> dict[str, object]:
        return {
            "sharding_group_size": self.sharding_group_size,
            "fits": self.fits,
            "memory_per_rank_bytes": self.memory_per_rank_bytes,
            "a2a_s": self.a2a_s,
            "sync_s": self.sync_s,
            "compute_s": self.compute_s,
            "imbalance": self.imbalance,
            "step_s": self.step_s,
        }


class CostModel(ABC):
    """Estimates one candidate group size."""

    @abstractmethod
    def estimate(self, group_size: int) -> Candidate: ...


def zipf_unique(rows: int, draws: float, exponent: float, buckets: int = 2048) -> float:
    """Expected distinct rows among ``draws`` ids with ``P(i) ~ i^-exponent`` over ``rows``.

    ``sum_i 1 - exp(-draws * p_i)`` (Poisson approximation), summed exactly for small
    tables and over geometric buckets of ``i`` for large ones (within ~1%).
    """
    import numpy as np

    if draws <= 0:
        return 0.0
    if rows <= 4 * buckets:
        i = np.arange(1, rows + 1, dtype=np.float64)
        count = np.ones_like(i)
    else:
        edges = np.unique(np.geomspace(1, rows + 1, buckets).astype(np.int64))
        count = np.diff(edges).astype(np.float64)
        i = np.sqrt(edges[:-1] * (edges[1:] - 1.0).clip(min=edges[:-1]))
    weight = i**-exponent
    p = weight / float((weight * count).sum())
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
    """Ring all-reduce time of ``nbytes`` per rank over ``members`` (bottleneck link)."""
    n = len(members)
    if n <= 1 or nbytes <= 0:
        return 0.0
    _, remote = _peers(topology, members)
    bw = topology.inter_host_bw if remote else topology.intra_host_bw
    alpha = topology.inter_host_latency_s if remote else topology.intra_host_latency_s
    steps = 2 * (n - 1) if topology.allreduce_latency == "ring" else 2 * math.ceil(math.log2(n))
    return 2 * (n - 1) / n * nbytes / bw + steps * alpha


class AnalyticCostModel(CostModel):
    """The formulas of the module docstring over a TorchRec group layout."""

    def __init__(
        self, workload: Workload, topology: ClusterTopology, planner: GroupLayoutPlanner
    ) -> None:
        self.workload, self.topology, self.planner = workload, topology, planner
        self._by_name = {t.name: t for t in workload.tables}

    def estimate(self, group_size: int) -> Candidate:
        w, topo = self.workload, self.topology
        replicas = topo.world_size // group_size
        group = rank_layout(topo.world_size, group_size, w.replica_layout)[0]
        local_peers, _ = _peers(topo, group)
        layouts = self.planner.layouts(w, group_size, local_peers + 1, topo.compute_device)
        results = [self._estimate(layout, replicas, group) for layout in layouts]
        fitting = [c for c in results if c.fits]
        if fitting:
            return min(fitting, key=lambda c: c.step_s)
        return min(results, key=lambda c: c.memory_per_rank_bytes)

    def _estimate(self, layout: GroupLayout, replicas: int, group: list[int]) -> Candidate:
        w, topo = self.workload, self.topology
        L, B, eb = layout.group_size, w.batch_size_per_rank, w.element_bytes
        per_rank = layout.per_rank()
        memory, state, synced, lookup = [0] * L, [0] * L, [0.0] * L, [0.0] * L
        send, recv = [0.0] * L, [0.0] * L
        ids_send, ids_recv = [0.0] * L, [0.0] * L
        out_total = ids_total = 0.0
        for rank, shards in enumerate(per_rank):
            for s in shards:
                t, n = self._by_name[s.table], s.count
                weights, opt = shard_state_bytes(s, w, replicas)
                state[rank] += n * (weights + opt)
                memory[rank] += n * (weights + opt + s.io_bytes)
                synced[rank] += n * self._synced_bytes(s, replicas)
                share = s.rows / t.rows
                ids = L * B * t.features * t.pooling_factor * share  # group ids hitting s
                lookup[rank] += n * ids * s.cols * eb
                out = n * B * t.features * s.cols * eb  # one rank's samples, these columns
                send[rank] += (L - 1) * out
                out_total += out
                ids_recv[rank] += n * (L - 1) / L * ids * ID_BYTES
                ids_total += n * ids / L * ID_BYTES
                recv[rank] -= out  # its own samples never leave the rank
                ids_send[rank] -= n * ids / L * ID_BYTES
        a2a = [
            2 * max(send[r], recv[r] + out_total) + max(ids_send[r] + ids_total, ids_recv[r])
            for r in range(L)
        ]
        a2a_bytes = max(a2a)
        a2a_s = self._a2a_s(a2a_bytes, group)
        replica_ranks = replica_groups(topo.world_size, L, w.replica_layout)[0]
        sync_bytes = max(synced)
        sync_s = _allreduce_s(sync_bytes, replica_ranks, topo)
        sync_s = (sync_s + (topo.sync_overhead_s if replicas > 1 else 0.0)) / w.sync_every
        if w.sharding_strategy == "fully_sharded" and replicas > 1:
            # sparse2d's FULLY_SHARDED, every step: all-gather the weights for the lookup,
            # all-gather weights + state for the fused update, reduce-scatter both after it:
            # 1.5 all-reduces of a rank's full shard bytes; it replaces the cadence sync.
            full = max(
                sum(s.count * s.rows * (s.cols + w.row_state_values(s.cols)) * eb for s in ss)
                for ss in per_rank
            )
            sync_s = 1.5 * _allreduce_s(full, replica_ranks, topo) + topo.sync_overhead_s
        mean_lookup = sum(lookup) / L
        compute_s = 3 * max(lookup) / topo.lookup_bw + 6 * w.dense_params * B / topo.dense_flops
        dense_s = _allreduce_s(w.dense_params * 4, list(range(topo.world_size)), topo)
        mem = max(memory)
        return Candidate(
            sharding_group_size=L,
            num_replicas=replicas,
            fits=mem <= topo.usable_memory_bytes,
            memory_per_rank_bytes=mem,
            state_per_rank_bytes=max(state),
            memory_imbalance=mem / (sum(memory) / L) if sum(memory) else 1.0,
            a2a_bytes=int(a2a_bytes),
            a2a_s=a2a_s,
            sync_bytes=int(sync_bytes),
            sync_s=sync_s,
            compute_s=compute_s,
            imbalance=max(lookup) / mean_lookup if mean_lookup else 1.0,
            dense_s=dense_s,
            step_s=compute_s + a2a_s + sync_s + dense_s + topo.step_overhead_s,
            proposal=layout.proposal,
        )

    def _synced_bytes(self, s: PlacedShard, replicas: int) -> float:
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
        if w.engine == "auto" and union > w.sparse_crossover * s.rows:
            return float(dense)
        return union * (row * w.element_bytes + ID_BYTES)

    def _a2a_s(self, nbytes: float, group: list[int]) -> float:
        """Three all-to-alls (ids, pooled output, gradients) over the group's links."""
        topo = self.topology
        local, remote = _peers(topo, group)
        peers = local + remote
        if peers == 0:
            return 0.0
        bandwidth_s = max(
            nbytes * remote / peers / topo.inter_host_bw,
            nbytes * local / peers / topo.intra_host_bw,
        )
        latency_s = 3 * (remote * topo.inter_host_latency_s + local * topo.intra_host_latency_s)
        return bandwidth_s + latency_s
