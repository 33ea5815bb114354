"""The advisor's cost terms, one small function each (``docs/advisor_cost_model.md``).

Each function models one mechanism of a 2D step, per rank, and says which measurement or
hardware figure sets its constants. The constants themselves live in the topology (YAML
presets under ``sparse2d/advisor/presets/``, every field with its source), never here:
nothing in this module is tuned to reach a published number.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from sparse2d.advisor.topology import ClusterTopology
from sparse2d.errors import ConfigError, PlanError

ID_BYTES = 8
"""int64 ids (and their lengths, neglected) in the input all-to-all; TorchRec never
quantizes ids."""

QCOMM_BYTES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}
"""Bytes per value on the wire for TorchRec's ``CommType`` (``fbgemm_qcomm_codec.py``:
``QCommsConfig.forward_precision`` / ``backward_precision``; FP8/INT8 add a per-row scale
that is neglected here)."""

TW_LIKE = ("table_wise", "column_wise", "table_column_wise", "data_parallel")
RW_LIKE = ("row_wise",)
HOST_RW_LIKE = ("table_row_wise", "grid_shard")


def qcomm_bytes(precision: str) -> int:
    """Wire bytes per pooled-embedding value for a qcomm precision (``QCOMM_BYTES``)."""
    if precision not in QCOMM_BYTES:
        raise ConfigError(f"qcomm precision {precision!r} is unknown; use {sorted(QCOMM_BYTES)}.")
    return QCOMM_BYTES[precision]


@dataclass(slots=True)
class LinkBytes:
    """Values one rank sends and receives in one output all-to-all, split by link class."""

    send_intra: float = 0.0
    send_inter: float = 0.0
    recv_intra: float = 0.0
    recv_inter: float = 0.0

    def add(self, other: LinkBytes, times: float = 1.0) -> None:
        self.send_intra += times * other.send_intra
        self.send_inter += times * other.send_inter
        self.recv_intra += times * other.recv_intra
        self.recv_inter += times * other.recv_inter

    @property
    def intra(self) -> float:
        return max(self.send_intra, self.recv_intra)

    @property
    def inter(self) -> float:
        return max(self.send_inter, self.recv_inter)


def output_values_sent(
    sharding_type: str, values: float, group_size: int, host_ranks: int
) -> LinkBytes:
    """Pooled-output values a shard's rank sends in the forward output dist (TorchRec).

    ``values`` = ``B x features x shard cols`` (one rank's samples). With ``L`` ranks in the
    group, ``H`` of them on this host:

    * table/column-wise: the holder sends each other rank its samples' output,
      ``(L-1) x values`` (``H-1`` of them over intra-host links);
    * row-wise: every rank reduce-scatters partial sums for the whole group's batch,
      ``(L-1)/L x L x values`` = ``(L-1) x values``, per shard (so ``L`` times a table's
      table-wise bytes);
    * table-row-wise and grid (row shards within one host): an intra-host reduce-scatter of
      ``(H-1)/H x L x values``, then ``(L-H)/H x values`` across hosts and ``(H-1)/H x
      values`` to the host's own ranks (TorchRec's ``TwRwPooledEmbeddingDist``). At ``H = L``
      this is row-wise.

    Receive side is added by the caller (it depends on where the other shards sit).
    """
    L, H = group_size, max(1, min(host_ranks, group_size))
    if sharding_type in TW_LIKE:
        return LinkBytes(send_intra=(H - 1) * values, send_inter=(L - H) * values)
    if sharding_type in RW_LIKE:
        sent = LinkBytes(send_intra=(H - 1) * values, send_inter=(L - H) * values)
        sent.recv_intra, sent.recv_inter = sent.send_intra, sent.send_inter  # symmetric
        return sent
    if sharding_type in HOST_RW_LIKE:
        scatter = (H - 1) / H * L * values
        return LinkBytes(
            send_intra=scatter + (H - 1) / H * values,
            send_inter=(L - H) / H * values,
            recv_intra=scatter,
        )
    raise PlanError(
        f"sharding type {sharding_type!r} has no output cost term; the cost model knows "
        f"{TW_LIKE + RW_LIKE + HOST_RW_LIKE}: force one of them for this table."
    )


def scattered_values(
    sharding_type: str, values: float, group_size: int, host_ranks: int
) -> LinkBytes:
    """The part of ``output_values_sent`` that is a reduce-scatter, not an all-to-all: all
    of row-wise's output, the intra-host scatter of table-row-wise and grid, none of
    table/column-wise's (TorchRec: ``reduce_scatter`` forward, ``all_gather`` backward)."""
    L, H = group_size, max(1, min(host_ranks, group_size))
    if sharding_type in RW_LIKE:
        return output_values_sent(sharding_type, values, L, H)
    if sharding_type in HOST_RW_LIKE:
        scatter = (H - 1) / H * L * values
        return LinkBytes(send_intra=scatter, recv_intra=scatter)
    return LinkBytes()


def scatter_s(intra_bytes: float, inter_bytes: float, topology: ClusterTopology) -> float:
    """Bandwidth time of the reduce-scatter part of an output dist: the slower link class at
    the topology's bandwidths times ``scatter_bw_factor``. Fitted on gloo apart from the
    all-to-all (``bench/planner_fit.py``): with one cost for both, the fit set's own
    row-wise series ranked its L backwards."""
    f = topology.scatter_bw_factor
    return max(
        intra_bytes / (f * topology.intra_host_bw), inter_bytes / (f * topology.inter_host_bw)
    )


def cpu_share(topo: ClusterTopology) -> float:
    """How many ranks share one core of a host (``cores_per_host``; 1 where not shared)."""
    if not topo.cores_per_host:
        return 1.0
    return max(1.0, min(topo.world_size, topo.ranks_per_host) / topo.cores_per_host)


def on_shared_cores(topo: ClusterTopology) -> ClusterTopology:
    """The topology one rank sees when the ranks of a host outnumber its cores: every
    constant that is CPU work (lookups, row updates, dense FLOPs, the fixed step and sync
    costs, the per-value work around the all-to-all, and on a CPU box the collectives
    themselves: gloo copies and reduces on the cores) runs at ``1 / cpu_share`` speed.
    Measured on the 2-core box: FBGEMM's per-id cost with 4 and 8 concurrent ranks is
    2.0-2.2x and 4.2-4.6x one rank's (``bench/lookup_cost.py``); the fit set's sync per byte
    at world 8 is ~2x world 4's. Identity where cores are not shared (GPU presets)."""
    share = cpu_share(topo)
    if topo.host_link_bw:  # a rank's share of its host's link caps the inter-host bandwidth
        link = topo.host_link_bw / topo.ranks_per_host
        topo = dataclasses.replace(
            topo, inter_host_bw=min(topo.inter_host_bw / share, link) * share
        )
    if share == 1.0:
        return topo
    return dataclasses.replace(
        topo,
        intra_host_bw=topo.intra_host_bw / share,
        inter_host_bw=topo.inter_host_bw / share,
        intra_host_latency_s=topo.intra_host_latency_s * share,
        inter_host_latency_s=topo.inter_host_latency_s * share,
        lookup_bw=topo.lookup_bw / share,
        row_update_s=topo.row_update_s * share,
        dense_flops=topo.dense_flops / share,
        step_overhead_s=topo.step_overhead_s * share,
        sync_overhead_s=topo.sync_overhead_s * share,
        a2a_value_s=topo.a2a_value_s * share,
        cores_per_host=0.0,
    )


def lookup_s(lookup_bytes: float, touched_rows: float, topo: ClusterTopology) -> float:
    """Forward + backward embedding work of one rank in one step.

    Bytes: each looked-up value is read in the forward, its gradient written in the backward
    and the row read and written by the fused optimizer (3 passes at ``lookup_bw``). Rows:
    the backward groups ids by row and the fused optimizer updates each *distinct* row once,
    a per-row cost that does not shrink with the row's width. FBGEMM's CPU kernels, one
    thread (``bench/lookup_cost.py``): 0.5 us per distinct row at dim 8 to 128 and a few
    hundredths of a us per id. ``row_update_s`` is that measurement; ``lookup_bw`` (which
    also carries TorchRec's per-id work around the kernel) is fitted on the fit set
    (``bench/planner_fit.py``).
    """
    return 3 * lookup_bytes / topo.lookup_bw + touched_rows * topo.row_update_s


def link_time_s(intra_bytes: float, inter_bytes: float, topology: ClusterTopology) -> float:
    """Bandwidth time of an all-to-all whose intra- and inter-host parts run concurrently
    (NVLink and the NICs are separate links): the slower part. Bandwidths are the
    topology's *effective* collective bandwidths (preset sources in its YAML) times its
    ``a2a_bw_factor`` (fitted on gloo: all-to-alls reach ~0.15 of an all-reduce's
    bandwidth there, ``bench/planner_fit.py``)."""
    f = topology.a2a_bw_factor
    inter_bw = f * topology.inter_host_bw
    if topology.host_link_bw:  # a wire: the loopback fit's factor does not speed it up
        inter_bw = min(inter_bw, topology.host_link_bw / topology.ranks_per_host)
    return max(intra_bytes / (f * topology.intra_host_bw), inter_bytes / inter_bw)


def output_values_s(values: float, topo: ClusterTopology) -> float:
    """CPU time of the pooled ``values`` one rank moves through a step's output all-to-all
    (forward values and backward gradients together), apart from their wire bytes: on the
    gloo box an fp16 all-to-all measured no faster than fp32 although it sends half the
    bytes. Fitted on the fit set's fp32 and fp16 twins (``bench/planner_fit.py``)."""
    return values * topo.a2a_value_s


def a2a_latency_s(remote_peers: int, collectives: int, topo: ClusterTopology) -> float:
    """Latency of ``collectives`` all-to-alls: one message time each, since every peer's
    send is posted at once (gloo's ``alltoall`` and NCCL's grouped send/recv alike), the
    inter-host one as soon as any peer is remote. ``cpu_gloo``'s latency is fitted on
    measured syncs and all-to-alls (``bench/planner_fit.py``); a per-peer latency was
    refuted by the fit set (it over-priced L=8 on 8 ranks by 20 ms)."""
    alpha = topo.inter_host_latency_s if remote_peers else topo.intra_host_latency_s
    return collectives * alpha


def allreduce_s(
    nbytes: float,
    members: int,
    remote: bool,
    topo: ClusterTopology,
    members_per_host: int = 1,
    link_nbytes: float | None = None,
) -> float:
    """Ring all-reduce of ``nbytes`` per rank over ``members`` ranks: ``2 (n-1)/n`` bytes per
    rank over the bottleneck link plus the latency steps of ``topo.allreduce_latency``
    (gloo: ring, ``2 (n-1)``; NCCL at scale: tree, ``2 log2 n``).

    With a host link (``topo.host_link_bw``) the ring crosses each host's link once per
    group, whose ``members_per_host`` members there are adjacent in it, and every group of
    the same shape runs at once: ``ranks_per_host / members_per_host`` rings share the link.
    The cores still copy and reduce every byte (``intra_host_bw``), at the same time as the
    link carries it: the slower of the two counts (measured on emulated hosts: full
    replication's ring over 2 hosts x 4 ranks moved 1.75 copies of its tables across each
    host's link per sync, the inter-host layout's pairs 1 copy per rank's shard).

    The rings share the link and TCP keeps it busy while any of them sends (work
    conserving): the last ring ends when the link has carried every ring's bytes, so the wire
    time is the rings' bytes summed, ``rings x link_nbytes`` (their mean shard; ``nbytes``
    where not given), not ``rings x`` the largest shard. Measured on 2 hosts x 4 ranks, a
    group of 4 inside each host at 200 Mbit/s: shards of 19.2, 19.2, 16.4 and 16.5 MB; the
    smaller rings ended at 2.4-2.7 s and the larger at 2.8-3.1 s (mean 2.94 s), against 2.85 s
    for the sum and 3.07 s for 4 x the largest."""
    if members <= 1 or nbytes <= 0:
        return 0.0
    alpha = topo.inter_host_latency_s if remote else topo.intra_host_latency_s
    if topo.allreduce_latency == "ring":
        steps = 2 * (members - 1)
    else:
        steps = 2 * math.ceil(math.log2(members))
    per_rank = 2 * (members - 1) / members * nbytes
    if remote and topo.host_link_bw:
        wire = ring_wire_s(
            nbytes if link_nbytes is None else link_nbytes, members, topo, members_per_host
        )
        return max(per_rank / topo.intra_host_bw, wire) + steps * alpha
    bw = topo.inter_host_bw if remote else topo.intra_host_bw
    return per_rank / bw + steps * alpha


def ring_wire_s(
    link_nbytes: float, members: int, topo: ClusterTopology, members_per_host: int
) -> float:
    """Seconds a host's link carries the rings of an all-reduce that crosses it: ``ranks_per_host
    / members_per_host`` rings side by side, each ``2 (n-1)/n`` of its member's bytes
    (``link_nbytes``: the mean over the rings), at ``host_link_bw`` (``allreduce_s``)."""
    rings = max(1.0, topo.ranks_per_host / max(1, members_per_host))
    return rings * 2 * (members - 1) / members * link_nbytes / topo.host_link_bw


def hidden_allreduce_s(
    nbytes: float,
    members: int,
    remote: bool,
    topo: ClusterTopology,
    members_per_host: int,
    beside_s: float,
    link_nbytes: float | None = None,
) -> float:
    """What an all-reduce of ``nbytes`` per rank adds to a step when it runs in the background
    beside ``beside_s`` of other work before anything waits for it: a hidden burst
    (``SyncOptions.hide``: from the end of a backward to the next lookup, which lands it) or
    a streamed fragment (behind the whole next step). A host link carries its bytes while
    the cores do that work, so only its wire time beyond ``beside_s`` is exposed, whatever
    ``topo.comm_overlap`` says (that is the cores' own overlap); the cores' copy and reduce
    hide by ``comm_overlap`` (0 where processes share the cores) and the latency steps are
    paid, as ``allreduce_s`` prices them."""
    total = allreduce_s(nbytes, members, remote, topo, members_per_host, link_nbytes)
    if not (remote and topo.host_link_bw) or total == 0.0:
        return exposed_s(total, beside_s, topo.comm_overlap)
    wire = ring_wire_s(
        nbytes if link_nbytes is None else link_nbytes, members, topo, members_per_host
    )
    cores = 2 * (members - 1) / members * nbytes / topo.intra_host_bw
    latency = total - max(cores, wire)
    return max(exposed_s(cores, beside_s, topo.comm_overlap), wire - beside_s) + latency


def vote_s(world: int, remote: bool, topo: ClusterTopology) -> float:
    """The NaN/inf vote of a guarded sync: one job-wide all-reduce of a few bytes (latency
    only)."""
    if world <= 1:
        return 0.0
    alpha = topo.inter_host_latency_s if remote else topo.intra_host_latency_s
    ring = topo.allreduce_latency == "ring"
    return (2 * (world - 1) if ring else 2 * math.ceil(math.log2(world))) * alpha


def fully_sharded_s(
    full_shard_bytes: float, replicas: int, remote: bool, topo: ClusterTopology
) -> float:
    """sparse2d's FULLY_SHARDED, every step (``sparse2d.core.fully_sharded``): all-gather the
    weights for the lookup, all-gather weights + state for the fused update, reduce-scatter
    both after it. An all-gather or reduce-scatter moves half an all-reduce's bytes, so the
    three are ~1.5 all-reduces of a rank's full (unsliced) shard bytes."""
    return 1.5 * allreduce_s(full_shard_bytes, replicas, remote, topo)


def exposed_s(background_s: float, concurrent_s: float, overlap: float) -> float:
    """What a background transfer adds to the step when it runs beside ``concurrent_s`` of
    other work that hides ``overlap`` of it (0..1): the train pipeline's input all-to-all
    beside the previous batch's forward/backward (TorchRec ``TrainPipelineSparseDist``:
    separate CUDA stream) and a hidden sync (``SyncOptions.hide``) beside the dense step and
    the next input dist. ``overlap`` is the topology's ``comm_overlap``: 0 on the gloo CPU
    box (``bench/RESULTS.md``, pipelines hide nothing there: processes share the cores)."""
    return max(background_s - overlap * concurrent_s, 0.0)


def straggler(loads: list[float]) -> float:
    """Max over mean of per-rank loads of the real plan: a group steps at its slowest rank,
    so every per-rank term of the model is taken at its maximum rank, and this ratio reports
    how much of it is imbalance."""
    mean = sum(loads) / len(loads) if loads else 0.0
    return max(loads) / mean if mean else 1.0
