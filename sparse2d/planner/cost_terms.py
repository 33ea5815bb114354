"""The advisor's cost terms, one small function each (``docs/advisor_cost_model.md``).

Each function models one mechanism of a 2D step, per rank, and says which measurement or
hardware figure sets its constants. The constants themselves live in the topology (YAML
presets under ``sparse2d/planner/presets/``, every field with its source), never here:
nothing in this module is tuned to reach a published number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sparse2d.planner.topology import ClusterTopology

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
        raise ValueError(f"qcomm precision {precision!r} is unknown; use {sorted(QCOMM_BYTES)}.")
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
    raise ValueError(f"sharding type {sharding_type!r} has no output cost term.")


def link_time_s(intra_bytes: float, inter_bytes: float, topology: ClusterTopology) -> float:
    """Bandwidth time of an all-to-all whose intra- and inter-host parts run concurrently
    (NVLink and the NICs are separate links): the slower part. Bandwidths are the
    topology's *effective* collective bandwidths (preset sources in its YAML) times its
    ``a2a_bw_factor`` (fitted on gloo: all-to-alls reach ~0.15 of an all-reduce's
    bandwidth there, ``bench/planner_fit.py``)."""
    f = topology.a2a_bw_factor
    return max(
        intra_bytes / (f * topology.intra_host_bw), inter_bytes / (f * topology.inter_host_bw)
    )


def a2a_latency_s(remote_peers: int, collectives: int, topo: ClusterTopology) -> float:
    """Latency of ``collectives`` all-to-alls: one message time each, since every peer's
    send is posted at once (gloo's ``alltoall`` and NCCL's grouped send/recv alike), the
    inter-host one as soon as any peer is remote. ``cpu_gloo``'s latency is fitted on
    measured syncs and all-to-alls (``bench/planner_fit.py``); a per-peer latency was
    refuted by the fit set (it over-priced L=8 on 8 ranks by 20 ms)."""
    alpha = topo.inter_host_latency_s if remote_peers else topo.intra_host_latency_s
    return collectives * alpha


def allreduce_s(nbytes: float, members: int, remote: bool, topo: ClusterTopology) -> float:
    """Ring all-reduce of ``nbytes`` per rank over ``members`` ranks: ``2 (n-1)/n`` bytes per
    rank over the bottleneck link plus the latency steps of ``topo.allreduce_latency``
    (gloo: ring, ``2 (n-1)``; NCCL at scale: tree, ``2 log2 n``)."""
    if members <= 1 or nbytes <= 0:
        return 0.0
    bw = topo.inter_host_bw if remote else topo.intra_host_bw
    alpha = topo.inter_host_latency_s if remote else topo.intra_host_latency_s
    if topo.allreduce_latency == "ring":
        steps = 2 * (members - 1)
    else:
        steps = 2 * math.ceil(math.log2(members))
    return 2 * (members - 1) / members * nbytes / bw + steps * alpha


def fold_s(region_bytes: float, world: int, remote: bool, topo: ClusterTopology) -> float:
    """A sync folded into DDP's gradient all-reduce (``sparse2d.sync.fold``): the region's
    bytes ride an all-reduce that runs anyway, so only its bandwidth counts, no latency and
    no per-sync overhead (``bench/RESULTS.md`` "Fold": 0.5 MB added to DDP's all-reduce cost
    nothing measurable on the gloo box)."""
    if world <= 1:
        return 0.0
    bw = topo.inter_host_bw if remote else topo.intra_host_bw
    return 2 * (world - 1) / world * region_bytes / bw


def vote_s(world: int, remote: bool, topo: ClusterTopology) -> float:
    """The NaN/inf vote of a guarded sync: one job-wide all-reduce of a few bytes (latency
    only). Zero when DDP's all-reduce carries it (``sparse2d.sync.ddp_vote``)."""
    if world <= 1:
        return 0.0
    alpha = topo.inter_host_latency_s if remote else topo.intra_host_latency_s
    ring = topo.allreduce_latency == "ring"
    return (2 * (world - 1) if ring else 2 * math.ceil(math.log2(world))) * alpha


def fully_sharded_s(
    full_shard_bytes: float, replicas: int, remote: bool, topo: ClusterTopology
) -> float:
    """sparse2d's FULLY_SHARDED, every step (``sparse2d.sync.fully_sharded``): all-gather the
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
