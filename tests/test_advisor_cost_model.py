"""The cost model on real TorchRec layouts (meta model, no process group): hand-computed answers."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from sparse2d.advisor.cost_model import ID_BYTES, AnalyticCostModel, zipf_unique
from sparse2d.advisor.group_layout import TorchRecGroupPlanner
from sparse2d.advisor.topology import ClusterTopology
from sparse2d.advisor.workload import TableLoad, Workload

ROWS, DIM, B = 1000, 16, 32
PLANNER = TorchRecGroupPlanner()


def topology(world: int, **kw: object) -> ClusterTopology:
    base = dict(
        world_size=world,
        ranks_per_host=world,
        compute_device="cpu",
        device_memory_bytes=2**30,
        intra_host_bw=1e9,
        intra_host_latency_s=1e-5,
        inter_host_bw=1e8,
        inter_host_latency_s=1e-4,
        lookup_bw=1e9,
        dense_flops=1e9,
    )
    base.update(kw)
    return ClusterTopology(**base)  # type: ignore[arg-type]


def workload(tables: tuple[TableLoad, ...], **kw: object) -> Workload:
    return Workload(tables=tables, batch_size_per_rank=B, **kw)  # type: ignore[arg-type]


TW2 = tuple(TableLoad(name, ROWS, DIM, sharding="table_wise") for name in "ab")
RW1 = (TableLoad("r", ROWS, DIM, pooling_factor=2.0, sharding="row_wise"),)


def test_table_wise_memory_a2a_and_sync_bytes_by_hand() -> None:
    # 2 table-wise tables on a group of 2: one per rank. World 4 -> 2 replicas.
    w = workload(TW2, optimizer="rowwise_adagrad")
    c = AnalyticCostModel(w, topology(4), PLANNER).estimate(2)
    state = ROWS * DIM * 4 + ROWS * 4  # weights + one row-wise accumulator per row
    assert c.state_per_rank_bytes == state
    assert c.memory_per_rank_bytes >= state  # plus TorchRec's I/O buffer estimate
    assert c.imbalance == pytest.approx(1.0)
    # pooled output for the other rank's B samples, forward and backward, plus B ids sent
    assert c.a2a_bytes == 2 * B * DIM * 4 + B * 8
    assert c.sync_bytes == state  # dense engine, optimizer state included
    # tree all-reduce over 2 replicas on one host: 2 (G-1)/G * bytes / bw + 2 log2(G) alpha,
    # plus the NaN/inf vote over the world of 4 (no DDP to carry it): 2 log2(4) alpha
    assert c.sync_s == pytest.approx(state / 1e9 + 2 * 1e-5 + 4 * 1e-5)
    # lookup: the group's 2B ids of its table, DIM floats each, read fwd + twice in bwd
    assert c.compute_s == pytest.approx(3 * 2 * B * DIM * 4 / 1e9)


def test_row_wise_shards_by_hand() -> None:
    w = workload(RW1, optimizer="adagrad", sync_every=4, check_finite=False)
    c = AnalyticCostModel(w, topology(8), PLANNER).estimate(4)
    rows = ROWS // 4
    assert c.state_per_rank_bytes == rows * DIM * 4 * 2  # Adagrad: one state per element
    # reduce-scatter of partial sums: (L-1) B DIM floats each way; ids: 3/4 of B*2 ids
    assert c.a2a_bytes == pytest.approx(2 * 3 * B * DIM * 4 + 3 / 4 * B * 2 * 8)
    assert c.sync_bytes == rows * DIM * 4 * 2
    assert c.sync_s == pytest.approx((c.sync_bytes / 1e9 + 2 * 1e-5) / 4)  # every 4 steps


def test_row_wise_table_smaller_than_the_group_leaves_empty_shards_priced() -> None:
    # 3 rows over a group of 8: TorchRec gives 5 ranks an empty shard (the CI crash was a
    # division by that shard's share of the table)
    tiny = (TableLoad("t", 3, DIM, sharding="row_wise"),)
    w = workload(tiny, zipf_exponent=1.0)
    c = AnalyticCostModel(w, topology(8, row_update_s=5e-7), PLANNER).estimate(8)
    assert math.isfinite(c.step_s) and c.compute_s > 0
    # 8 B ids into 3 rows touch all of them; the busiest rank holds one: one row update
    plain = AnalyticCostModel(w, topology(8), PLANNER).estimate(8)
    assert c.compute_s - plain.compute_s == pytest.approx(5e-7, rel=1e-3)


def test_one_group_never_syncs_and_one_rank_never_exchanges() -> None:
    w = workload(TW2)
    full = AnalyticCostModel(w, topology(2), PLANNER).estimate(2)
    assert full.num_replicas == 1 and full.sync_bytes == 0 and full.sync_s == 0
    single = AnalyticCostModel(w, topology(2), PLANNER).estimate(1)
    assert single.a2a_s == 0
    assert single.state_per_rank_bytes == 2 * (ROWS * DIM * 4 + ROWS * 4)


def test_optimizer_state_is_counted_per_kind() -> None:
    per_kind = {
        kind: AnalyticCostModel(workload(TW2, optimizer=kind), topology(2), PLANNER)
        .estimate(2)
        .state_per_rank_bytes
        for kind in ("sgd", "adagrad", "rowwise_adagrad", "adam")
    }
    weights = ROWS * DIM * 4
    assert per_kind == {
        "sgd": weights,
        "adagrad": 2 * weights,
        "rowwise_adagrad": weights + ROWS * 4,
        "adam": 3 * weights,
    }


def test_fully_sharded_splits_weights_over_replicas() -> None:
    w = workload(TW2, optimizer="rowwise_adagrad", sharding_strategy="fully_sharded")
    c = AnalyticCostModel(w, topology(8), PLANNER).estimate(2)
    assert c.state_per_rank_bytes == (ROWS * DIM * 4 + ROWS * 4) // 4  # G = 4, state too


def test_sync_without_optimizer_state_and_across_hosts() -> None:
    w = workload(TW2, include_optimizer_state=False, check_finite=False)
    # 2 ranks per host, intra_host layout, world 8, L=2: replicas of rank 0 are 0,1,2,3
    c = AnalyticCostModel(w, topology(8, ranks_per_host=2), PLANNER).estimate(2)
    assert c.sync_bytes == ROWS * DIM * 4
    assert c.sync_s == pytest.approx(2 * 3 / 4 * c.sync_bytes / 1e8 + 2 * 2 * 1e-4)


def test_sparse_engine_syncs_expected_touched_rows() -> None:
    big = (TableLoad("z", 10**6, DIM, sharding="table_wise"),)
    dense = AnalyticCostModel(workload(big), topology(4), PLANNER).estimate(2)
    sparse = AnalyticCostModel(workload(big, engine="sparse"), topology(4), PLANNER).estimate(2)
    touched = zipf_unique(10**6, 4 * B, 1.1)
    assert sparse.sync_bytes == pytest.approx(touched * ((DIM + 1) * 4 + 8), abs=1)
    assert sparse.sync_bytes < dense.sync_bytes / 100


def test_zipf_unique_matches_the_exact_sum() -> None:
    rows, draws, s = 200_000, 50_000.0, 1.05
    i = np.arange(1, rows + 1, dtype=np.float64)
    p = i**-s / (i**-s).sum()
    exact = float((-np.expm1(-draws * p)).sum())
    assert zipf_unique(rows, draws, s) == pytest.approx(exact, rel=0.02)
    assert zipf_unique(100, 1e9, 1.1) == pytest.approx(100)
    assert zipf_unique(10**7, 10.0, 1.1) <= 10.0


def test_memory_per_rank_is_never_below_the_even_split() -> None:
    tables = tuple(TableLoad(f"t{i}", 500 * (i + 1), DIM) for i in range(6))
    w = workload(tables)
    model = AnalyticCostModel(w, topology(8), PLANNER)
    for L in (1, 2, 4, 8):
        c = model.estimate(L)
        assert c.memory_per_rank_bytes >= math.ceil(w.weight_bytes / L)
        assert c.imbalance >= 1.0 and c.memory_imbalance >= 1.0


def test_a_streamed_sync_hides_its_wire_time_behind_the_next_step() -> None:
    """Two hosts joined by a slow link, replicas across it (inter_host): a burst pays the
    whole interval's bytes at once, a stream one fragment a step whose wire time runs behind
    the next step's work."""
    big = tuple(TableLoad(n, 200_000, DIM, sharding="table_wise") for n in "zy")  # one a rank
    kw = dict(
        sync_every=20,
        replica_layout="inter_host",
        hide=True,
        check_finite=False,
        dense_params=10**5,
    )
    slow = topology(4, ranks_per_host=2, host_link_bw=5e6, sync_overhead_s=0.0)
    burst = AnalyticCostModel(workload(big, **kw), slow, PLANNER).estimate(2)
    modes = dict(burst.sync_modes)
    assert burst.sync_s == modes["burst"]  # the workload's own mode is the step's term
    streamed = AnalyticCostModel(workload(big, stream=True, **kw), slow, PLANNER).estimate(2)
    assert streamed.sync_s == modes["streamed"] < modes["burst"] / 2
    beside = streamed.compute_s + streamed.a2a_s + streamed.dense_s
    # a pair of replicas on two hosts: each rank sends its fragment once; 2 rings per link
    wire = 2 * burst.sync_bytes / 20 / 5e6
    assert 0 < wire - beside < wire  # partly hidden
    assert modes["streamed"] == pytest.approx(wire - beside + 2 * 1e-4, rel=1e-6)
    # a sync every step: nothing to spread, no modes priced
    every = AnalyticCostModel(workload(big, hide=True), topology(4), PLANNER).estimate(2)
    assert every.sync_modes == ()


TW4 = tuple(TableLoad(name, ROWS, DIM, sharding="table_wise") for name in "abcd")


def test_host_link_bytes_by_hand() -> None:
    """What one host sends across its link per step, the figure the emulated cluster's
    interface counters check (bench/scaling_bench.py); catches a lost backward, ids or ring
    factor, or bytes counted per rank instead of per host."""
    w = workload(TW4, optimizer="sgd", dense_params=100, engine="dense", sync_every=4)
    two_hosts = topology(4, ranks_per_host=2)
    # 1D over 2 hosts x 2 ranks, a table per rank: a host serves its 2 tables to the 2
    # remote ranks (forward) and sends its 2 ranks' gradients for the 2 remote tables back
    one_d = AnalyticCostModel(w, two_hosts, PLANNER).estimate(4)
    terms = dict(one_d.host_link_terms)
    assert terms["output_a2a"] == pytest.approx(2 * 2 * 2 * B * DIM * 4)
    assert terms["input_a2a"] == pytest.approx(2 * 2 * B * 8)  # 2 ranks' ids, 2 remote tables
    assert terms["sync"] == 0.0
    assert terms["dense_allreduce"] == pytest.approx(2 * 3 / 4 * 100 * 4)  # one ring crossing
    assert one_d.host_link_bytes == pytest.approx(sum(terms.values()))
    # 2D, each group inside a host: no all-to-all crosses; each rank's 2 tables ring with its
    # replica on the other host (2 rings per link, 2 (G-1)/G = 1 copy each) every 4 steps
    inter = dataclasses.replace(w, replica_layout="inter_host")
    two_d = AnalyticCostModel(inter, two_hosts, PLANNER).estimate(2)
    terms = dict(two_d.host_link_terms)
    assert terms["output_a2a"] == terms["input_a2a"] == 0.0
    assert terms["sync"] == pytest.approx(2 * 2 * ROWS * DIM * 4 / 4)
    # one host: nothing crosses
    assert AnalyticCostModel(w, topology(4), PLANNER).estimate(4).host_link_bytes == 0.0


def test_a_hosts_sync_bytes_are_its_ranks_shards_summed() -> None:
    """3 tables on a group of 2 hold 2 and 1: the host's two rings carry 3 tables' bytes, not
    twice the larger shard's 2 (the sync's time still waits for the larger ring). Catches
    ``rings x max(shard)`` in ``_host_link_terms``: 4 tables' bytes, +33%."""
    w = workload(TW4[:3], optimizer="sgd", dense_params=100, engine="dense", sync_every=4)
    inter = dataclasses.replace(w, replica_layout="inter_host")
    c = AnalyticCostModel(inter, topology(4, ranks_per_host=2), PLANNER).estimate(2)
    assert c.sync_bytes == 2 * ROWS * DIM * 4  # the larger shard: what the slowest ring sends
    assert dict(c.host_link_terms)["sync"] == pytest.approx(3 * ROWS * DIM * 4 / 4)


def test_auto_syncs_the_touched_rows_where_the_ring_crosses_a_host_link() -> None:
    """``engine="auto"`` picks the cheaper mode by measured cost; on a host link the wire
    dominates, so a shard whose replicas touched 84% of its rows travels as those rows (with
    their agreement), not whole; on one host the loopback crossover (1/2) keeps it dense.
    Catches the host-link crossover removed (the 8-rank cluster cell's sync over by 13%)."""
    w = workload(
        TW4[:2], optimizer="sgd", engine="auto", sync_every=80, replica_layout="inter_host"
    )
    union = zipf_unique(ROWS, 4 * B * 80, 1.1)
    assert 0.8 * ROWS < union < 0.9 * ROWS
    linked = topology(4, ranks_per_host=2, host_link_bw=5e6)
    c = AnalyticCostModel(w, linked, PLANNER).estimate(2)
    assert c.sync_bytes == pytest.approx(union * (DIM * 4 + ID_BYTES), abs=1)  # int bytes
    flat = AnalyticCostModel(w, topology(4, ranks_per_host=2), PLANNER).estimate(2)
    assert flat.sync_bytes == ROWS * DIM * 4


def test_a_hosts_rings_finish_when_the_link_has_carried_all_their_bytes() -> None:
    """3 tables on a group of 2 hold 2 and 1; their two rings share each host's slow link,
    which stays busy while either sends: the sync takes 3 tables' bytes at the link's rate,
    not twice the larger shard's 2 (catches ``rings x max(shard)`` in the sync's time: +33%)."""
    w = workload(
        TW4[:3], optimizer="sgd", engine="dense", replica_layout="inter_host", check_finite=False
    )
    c = AnalyticCostModel(w, topology(4, ranks_per_host=2, host_link_bw=5e6), PLANNER).estimate(2)
    table = ROWS * DIM * 4
    assert c.sync_bytes == 2 * table  # the larger shard
    assert c.sync_s == pytest.approx(3 * table / 5e6 + 2 * 1e-4)  # 2 tree steps of latency


def test_a_hidden_sync_hides_one_input_dist_per_sync() -> None:
    """``hide``: a sync's all-reduce runs beside the next input dist once per sync, so a sync
    every 20 steps hides one input dist in 20 steps' worth of sync, not one a step (catches
    ``exposed_s(sync / every, ids a2a)``, which hid 20x too much where the cores overlap)."""
    kw = dict(optimizer="sgd", engine="dense", replica_layout="inter_host", check_finite=False)
    topo = topology(4, ranks_per_host=2)  # no host link: the cores overlap (comm_overlap 1)
    plain = AnalyticCostModel(workload(TW2, sync_every=20, hide=False, **kw), topo, PLANNER)
    hidden = AnalyticCostModel(workload(TW2, sync_every=20, hide=True, **kw), topo, PLANNER)
    shown, kept = plain.estimate(2), hidden.estimate(2)
    ids = kept.term("input_a2a")
    per_sync = shown.sync_s * 20
    assert 0 < ids < per_sync
    assert kept.sync_s == pytest.approx((per_sync - ids) / 20)
    assert kept.sync_s > 1.5 * (shown.sync_s - ids)  # the old units: 20 input dists hidden
