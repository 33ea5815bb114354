"""``sparse2d.advisor.trial``: the shortlist, the refused settings, the RNG left untouched, a
failing candidate skipped, and every failure listed. One process (no process group: the
agreement all-reduce is the identity); the world-4 trainer run is ``test_train_auto_trial``."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
import torch

from sparse2d.advisor.auto_pick import topology_for_device, workload_from_module
from sparse2d.advisor.search import advise
from sparse2d.advisor.trial import (
    TrialOptions,
    measure_group_sizes,
    rng_preserved,
    shortlist,
    step_time,
)
from sparse2d.errors import TrialError
from tests.models import MIXED_TABLES, build_model, constraints_for


def test_shortlist_keeps_the_model_pick_first_within_the_margin_at_most_k() -> None:
    workload = workload_from_module(
        build_model(MIXED_TABLES, device="meta"),
        32,
        None,
        "intra_host",
        constraints_for(MIXED_TABLES),
    )
    advice = advise(workload, topology_for_device(torch.device("cpu"), 8))
    wide = shortlist(advice, TrialOptions(candidates=64, margin=100.0))
    assert wide[0][0] == advice.recommended
    assert sorted(L for L, _ in wide) == [c.sharding_group_size for c in advice.candidates]
    assert [s for _, s in wide] == sorted(s for _, s in wide)
    assert shortlist(advice, TrialOptions(candidates=2, margin=100.0)) == wide[:2]
    best = wide[0][1]
    tight = shortlist(advice, TrialOptions(candidates=64, margin=0.1))
    assert tight == [(L, s) for L, s in wide if s <= best * 1.1]
    assert shortlist(advice, TrialOptions(candidates=0)) == wide[:1]  # the model's pick


def test_rng_is_restored_after_a_candidate_that_draws() -> None:
    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    with rng_preserved():
        torch.rand(5), random.random(), np.random.rand(3)
    after = (torch.rand(2), random.random(), np.random.rand(1))
    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    assert torch.equal(after[0], torch.rand(2)) and after[1] == random.random()
    assert after[2].tolist() == np.random.rand(1).tolist()


class _Model:
    """A real module stepped by the trial; ``close`` records that the trial released it."""

    def __init__(self, group_size: int, delay: float) -> None:
        self.group_size, self.delay, self.closed = group_size, delay, False
        self.linear = torch.nn.Linear(4, 4)  # draws from the torch RNG

    def step(self, i: int) -> None:
        time.sleep(self.delay)
        self.linear(torch.randn(2, 4)).sum().backward()

    def close(self) -> None:
        self.closed = True


def test_fastest_wins_a_failure_is_skipped_and_the_rng_is_untouched(caplog) -> None:
    built: list[_Model] = []
    delays = {1: 0.06, 2: 0.0, 4: 0.03}

    def build(group_size: int) -> _Model:
        if group_size == 8:
            raise MemoryError("CPU out of memory allocating 64 GiB")
        built.append(_Model(group_size, delays[group_size]))
        return built[-1]

    torch.manual_seed(3)
    before = torch.get_rng_state()
    options = TrialOptions(warmup_steps=1, timed_steps=3)
    report = measure_group_sizes(
        build, lambda m, i: m.step(i), [(8, 0.01), (1, 0.02), (4, 0.03), (2, 0.04)], options
    )
    assert torch.equal(torch.get_rng_state(), before)
    assert report.chosen == 2 and report.model_pick == 8
    # L=1, the first measured (it paid the first build), is measured again: still slowest
    assert all(m.closed for m in built) and [m.group_size for m in built] == [1, 4, 2, 2, 1]
    failed = report.results[0]
    assert failed.measured_s is None and failed.error.startswith("MemoryError: CPU out of")
    assert "L=8 skipped (MemoryError" in caplog.text
    measured = {r.sharding_group_size: r.measured_s for r in report.results[1:]}
    assert measured[2] < measured[4] < measured[1] and measured[1] >= 0.06
    text = report.table()
    assert "<- chosen (model: L=8)" in text and "failed: MemoryError" in text
    assert report.as_json()["candidates"][3]["measured_step_s"] == measured[2]


def test_a_sync_period_is_timed_whole_so_its_cost_counts() -> None:
    # A sync of 40 ms every 4th step: a median step would say 1 ms and hide it.
    times = [0.001, 0.001, 0.001, 0.041] * 2
    assert step_time(times) == pytest.approx(0.001)
    assert step_time(times, 4) == pytest.approx(0.011)
    assert step_time([0.001, 0.041, 0.001, 0.001, 0.001], 4) == pytest.approx(0.011)  # one period
    assert TrialOptions(timed_steps=5).timed_for(4) == 8 and TrialOptions().timed_for(1) == 5
    steps: list[int] = []
    report = measure_group_sizes(
        lambda L: _Model(L, 0.0),
        lambda m, i: steps.append(i),
        [(2, 0.1)],
        TrialOptions(warmup_steps=1, timed_steps=5),
        period=4,
    )
    assert steps == list(range(9))  # 1 warm-up + two whole periods of 4
    assert report.as_json()["timed_steps"] == 8 and report.as_json()["sync_period"] == 4


def test_a_near_tie_is_measured_again_in_reverse_order_and_keeps_the_lower_time() -> None:
    order: list[int] = []
    slow_first = {1: 0.03, 2: 0.025, 4: 0.2}  # the first pass of L=1 and L=2 is loaded

    def build(group_size: int) -> _Model:
        order.append(group_size)
        delay = slow_first.pop(group_size, None)
        return _Model(group_size, delay if delay is not None else {1: 0.002, 2: 0.015}[group_size])

    options = TrialOptions(warmup_steps=0, timed_steps=3, retrial_margin=1.0)
    report = measure_group_sizes(
        build, lambda m, i: m.step(i), [(1, 0.1), (2, 0.1), (4, 0.1)], options
    )
    assert order == [1, 2, 4, 2, 1]  # L=4 was not near the fastest: measured once
    passes = {r.sharding_group_size: r.passes_s for r in report.results}
    assert len(passes[4]) == 1 and len(passes[1]) == len(passes[2]) == 2
    assert passes[1][0] > 0.03 and passes[1][1] < 0.03  # the lower pass is kept
    assert report.chosen == 1 and report.results[0].measured_s == min(passes[1])
    assert "re-measured, <- chosen" in report.table()
    order.clear()
    once = measure_group_sizes(
        lambda L: build(L) if L in (1, 2) else _Model(L, 0.1),
        lambda m, i: m.step(i),
        [(1, 0.1), (2, 0.1)],
        TrialOptions(warmup_steps=0, timed_steps=2, retrial_margin=0.0),
    )
    assert order == [1, 2] and all(len(r.passes_s) == 1 for r in once.results)


def test_the_first_candidate_is_measured_again_since_it_paid_the_first_build() -> None:
    """A cold first pass (5x its own step in auto_bench's new_tw_dim64) must not lose the
    fastest candidate: it is measured again even when far outside the near-tie margin."""
    order: list[int] = []
    cold = {4: 0.08}  # only the process's first build is slow

    def build(group_size: int) -> _Model:
        order.append(group_size)
        return _Model(group_size, cold.pop(group_size, {4: 0.002, 2: 0.01}[group_size]))

    options = TrialOptions(warmup_steps=0, timed_steps=3, retrial_margin=0.15)
    report = measure_group_sizes(build, lambda m, i: m.step(i), [(4, 0.1), (2, 0.2)], options)
    assert order == [4, 2, 2, 4]  # L=2 was the fastest of the first pass; L=4 far behind it
    assert report.chosen == 4 and len(report.results[0].passes_s) == 2
    assert report.results[0].passes_s[0] > 0.08 > report.results[0].measured_s


def test_every_candidate_failing_is_one_line_naming_each() -> None:
    def build(group_size: int) -> _Model:
        raise RuntimeError(f"plan for L={group_size} does not fit\n(second line)")

    with pytest.raises(TrialError) as info:
        measure_group_sizes(build, lambda m, i: None, [(1, 0.1), (2, 0.2)])
    message = str(info.value)
    assert "\n" not in message
    assert "L=1: RuntimeError: plan for L=1 does not fit" in message
    assert "L=2: RuntimeError: plan for L=2 does not fit" in message
    with pytest.raises(TrialError, match="none fits memory"):
        measure_group_sizes(build, lambda m, i: None, [])
