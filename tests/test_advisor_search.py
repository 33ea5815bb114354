"""The advisor's choice over every divisor of the world size, and its no-fit error."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sparse2d.advisor.render import format_table, to_json
from sparse2d.advisor.search import advise, recommend_group_size
from sparse2d.advisor.topology import ClusterTopology
from sparse2d.advisor.workload import TableLoad, Workload
from sparse2d.errors import NoFitError

TABLES = tuple(TableLoad(f"t{i}", 20_000, 32, sharding="table_wise") for i in range(8))
WORKLOAD = Workload(tables=TABLES, batch_size_per_rank=64)
TOPO = ClusterTopology(
    world_size=8,
    ranks_per_host=4,
    compute_device="cpu",
    device_memory_bytes=2**30,
    intra_host_bw=1e10,
    inter_host_bw=1e9,
    lookup_bw=1e10,
    dense_flops=1e12,
)


def test_recommends_the_fastest_fitting_group_and_explains_it() -> None:
    advice = advise(WORKLOAD, TOPO)
    assert [c.sharding_group_size for c in advice.candidates] == [1, 2, 4, 8]
    best = min((c for c in advice.candidates if c.fits), key=lambda c: c.step_s)
    assert advice.recommended == best.sharding_group_size
    assert f"L={best.sharding_group_size}" in advice.reason
    table = format_table(advice)
    assert (
        "recommended: sharding_group_size=" in table and table.count("\n") == 11
    )  # header, 4 L, terms header, 4 L, recommendation


def test_memory_decides_when_small_groups_do_not_fit() -> None:
    # weights + row-wise state of all tables: 8 * 20000 * 33 * 4 bytes = 21.1 MB
    total = 8 * 20_000 * 33 * 4
    tight = dataclasses.replace(TOPO, device_memory_bytes=int(total / 3), reserved_fraction=0.0)
    advice = advise(WORKLOAD, tight)
    for c in advice.candidates:
        assert c.memory_per_rank_bytes >= WORKLOAD.weight_bytes / c.sharding_group_size
        if WORKLOAD.weight_bytes / c.sharding_group_size > tight.device_memory_bytes:
            assert not c.fits
    assert not advice.candidate(1).fits and not advice.candidate(2).fits
    assert advice.recommended in (4, 8)
    assert "needs" in advice.reason  # names the L that ran out of memory


def test_nothing_fits_lists_numbered_fixes_with_numbers() -> None:
    tiny = dataclasses.replace(TOPO, device_memory_bytes=100_000)
    with pytest.raises(NoFitError) as info:
        recommend_group_size(WORKLOAD, tiny)
    text = str(info.value)
    assert "1. use at least" in text and "--world-size" in text
    assert "2. use devices with >=" in text and "3. use optimizer.sparse.kind=sgd" in text
    assert "4. shrink the tables" in text


def test_json_is_one_object_with_every_candidate() -> None:
    data = json.loads(to_json(advise(WORKLOAD, TOPO)))
    assert set(data) == {"world_size", "recommended", "recommended_layout", "reason", "candidates"}
    assert data["world_size"] == 8 and len(data["candidates"]) == 4
    keys = {
        "sharding_group_size",
        "fits",
        "memory_per_rank_bytes",
        "a2a_s",
        "sync_s",
        "compute_s",
        "imbalance",
        "step_s",
        "sharding_types",
        "terms",
        "sync_kind",
        "replica_layout",
        "sync_modes",
        "host_link_bytes",
        "host_link_terms",
    }
    assert all(set(c) == keys for c in data["candidates"])


def test_more_sync_cadence_favours_smaller_groups() -> None:
    every_step = advise(WORKLOAD, TOPO)
    rare = advise(dataclasses.replace(WORKLOAD, sync_every=1000), TOPO)
    for L in (1, 2, 4):
        assert rare.candidate(L).sync_s < every_step.candidate(L).sync_s
    assert (rare.recommended or 0) <= (every_step.recommended or 0)


def test_the_table_says_whether_to_stream_the_sync() -> None:
    """With a cadence each replicated L's sync is priced as a burst and streamed, and the
    line under the table names the cheaper setting: here streaming loses at L=1 (its fixed
    costs paid every step) and wins at L=4."""
    from sparse2d.advisor.render import sync_mode_lines

    advice = advise(dataclasses.replace(WORKLOAD, sync_every=8, hide=True), TOPO)
    for size, pick in ((1, "false"), (4, "true")):
        modes = dict(advice.candidate(size).sync_modes)
        assert (modes["streamed"] < modes["burst"]) == (pick == "true"), modes
        (line,) = sync_mode_lines(advice.candidate(size))
        assert line.startswith(f"sync per step at L={size}: burst ")
        assert line.endswith(f"parallel.sync.stream={pick} is the cheaper on these links")
    assert advice.candidate(8).sync_modes == ()  # 1D: nothing to sync
    assert "sync per step" not in format_table(advise(WORKLOAD, TOPO))  # every step
