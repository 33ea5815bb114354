"""Fault tolerance on the emulated cluster (``FT=1 launch/emulated_hosts.sh``): a host lost
with every process on it, a host's link cut for 30 s, a host's link 10x slower for 30 s.

2 hosts x 2 ranks, one fault-tolerant sharding group per host (its ranks are that host's), the
lighthouse on the bridge, every byte between groups over the hosts' shaped links. The faults
and the figures are ``bench/cluster_faults.py``'s (its section of bench/RESULTS.md); here
they are asserted. Root only (namespaces, tc): CI runs as root; elsewhere they skip.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
from cluster_faults import TIMEOUT_S, analyse, run_fault

STEPS = 2000
"""500 more than the bench's job: group 0 trains alone at ~60 steps/s while host 1 restarts
(12.8 s there, more on a loaded CI box); it must still be training when host 1 is back, or
host 1's group finds the job finished and ends instead of healing. The runs' length only:
the tests check that host 1 came back by its records (``group1_ended``, or no later step
of group 0 with both groups, says it did not)."""

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="emulated hosts need root (ip netns, bridges, tc); CI runs as root"
)


@pytest.fixture(scope="module")
def slow_link(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Host 1's link 10x slower for 30 s. No group is dropped, so this run is numerically the
    uninterrupted job (its digests equal a plain run's; bench/cluster_faults.py shows both):
    the host-loss test's AUC reference."""
    return run_fault("slow_link", tmp_path_factory.mktemp("slow_link"), steps=STEPS)


def test_a_slow_link_drops_no_group_and_throughput_returns(slow_link: dict) -> None:
    r = analyse(slow_link)
    assert r["rc"] == 0, slow_link["tail"]
    # default timeouts: no false failure, nobody restarted, every step with both groups
    assert r["failed_commits"] == [0, 0] and r["restarts"] == [0, 0], r
    assert r["min_groups_in_step"] == [2, 2] and r["identical"], r
    # the slowdown was felt (each step's sync waits on the 2 Mbit/s link) and went away
    assert r["step_s_during"] > 2 * r["step_s_before"], r
    assert r["step_s_after"] < r["step_s_during"] / 2, r


def test_a_lost_host_costs_one_group_which_heals_from_a_live_peer(
    tmp_path: Path, slow_link: dict
) -> None:
    """Every process in host 1's namespace SIGKILLed at a step >= 120, its launcher included;
    the emulator starts host 1's launch again (a scheduler restarting a lost node)."""
    event = run_fault("host_loss", tmp_path, steps=STEPS)
    r = analyse(event, reference=slow_link)
    assert r["rc"] == 0 and event["killed"] >= 3, event["tail"]  # launcher, agent, workers
    # host 1 came back while group 0 still trained: it ended, finding the job over, or group
    # 0 never again logged a step with both groups (this box too slow for the STEPS budget)
    assert "group1_ended" not in r and r.get("group1_back_after_s", 0) > 0, r
    # group 0 never stopped: the same worker processes, no step redone, it trained alone
    assert r["survivor_pids_kept"] and r["restarts"][0] == 0, r
    assert r["steps_redone_group0"] == 0 and r["survivor_steps_alone"] > 0, r
    # host 1's group came back, healed from group 0 over the link, and both finished
    assert r["heal_from_group"] == 0 and r["heal_bytes_per_rank"] > 0, event["g1"]["heals"]
    assert r["final_steps"] == [STEPS, STEPS] and r["identical"], r
    assert abs(r["auc_delta"]) <= 0.005, r


def test_a_partitioned_host_rejoins_and_never_commits_alone(tmp_path: Path) -> None:
    """Host 1's link down for 30 s at a step >= 120, then up: group 0 commits on once its
    cross-group all-reduce times out; group 1 cannot reach the lighthouse, so it forms no
    quorum and commits nothing until the link is back, then heals from group 0."""
    event = run_fault("partition", tmp_path, steps=STEPS)
    r = analyse(event)
    assert r["rc"] == 0, event["tail"]
    assert "group1_ended" not in r, r  # group 0 is still training when it is back
    # the cut was felt: group 0's step in flight failed to commit (its cross-group
    # all-reduce timed out on the cut peer); with no cut every check below holds too
    assert r["survivor_failed_commits"] >= 1, r
    # ... and its stall ended by an event: it went on alone (a quorum without group 1)
    # while the link was down, or the link's return released it within one timeout (under
    # the suite's load a rank of group 0 was still held until the link was back: cause not
    # found; on a quiet box it goes on alone, issue 64's note)
    if not r["survivor_alone_during_cut"]:
        assert r["survivor_back_after_link_s"] is not None, r
        assert r["survivor_back_after_link_s"] <= TIMEOUT_S, r
    # group 1 never committed a step in a quorum without group 0 ...
    assert r["min_groups_in_step"][1] == 2 and r["restarts"] == [0, 0], r
    # ... and came back: healed from group 0 where it went on alone (the usual case), or
    # met it at the same step where the cut held group 0 until the link was back
    if r["survivor_steps_alone"] > 0:
        assert r["heal_from_group"] == 0 and r["heal_bytes_per_rank"] > 0, r
    assert r["final_steps"] == [STEPS, STEPS] and r["identical"], r
