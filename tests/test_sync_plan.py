"""``sync.plan``: the payloads of one sync and where each lands, from the call's options."""

from __future__ import annotations

import time

import pytest

from sparse2d.sync.plan import Opening, Part, plan_sync


def _plan(states=True, async_states=False, hide=False, copies=False):
    return plan_sync(states=states, async_states=async_states, hide=hide, copies=copies)


def test_weights_and_state_with_one_timing_travel_as_one_payload() -> None:
    plan = _plan()
    assert plan.parts == [Part("all", True, True, False)]
    assert plan.in_place and not plan.hide and not plan.background


def test_delayed_state_and_weights_only_split_the_payload() -> None:
    delayed = _plan(async_states=True)
    assert delayed.parts == [Part("weights", True, False, False), Part("states", False, True, True)]
    assert delayed.background and not delayed.in_place
    assert _plan(states=False).parts == [Part("weights", True, False, False)]
    assert _plan(states=False, async_states=True).parts == [Part("weights", True, False, False)]


@pytest.mark.parametrize("background", [False, True])
def test_hide_only_without_background_parts_and_copies_forbid_live_views(background) -> None:
    plan = _plan(async_states=background, hide=True)
    assert plan.hide is not background  # a background part lands with the next sync instead
    assert not _plan(copies=True).in_place  # a deferred channel


def test_opening_reports_the_landed_wait_with_the_next_sync() -> None:
    opening = Opening(step=7, waited=0.25, landed=0.5, divergence=0.01, began=time.perf_counter())
    report = opening.report(moved=1024)
    assert (report.step, report.bytes, report.divergence) == (7, 1024, 0.01)
    assert report.wait_seconds == 0.75
    assert 0.5 <= report.seconds < 60  # its own time plus the hidden sync's landing wait
