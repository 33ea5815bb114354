"""``DMPCollection(module, "auto")`` (``pick_group_size``) measures its shortlist on the
embedding part, says so, and leaves the model exactly as the chosen ``L`` given explicitly
would."""

from __future__ import annotations

import logging

import pytest
import torch

from sparse2d import ConfigError, DMPCollection, TrialOptions, pick_group_size
from sparse2d.advisor.embedding_trial import check_auto_options
from sparse2d.advisor.trial import TrialReport, TrialResult
from tests.models import MIXED_TABLES, build_model, constraints_for, train
from tests.state_views import flat_state

QUICK = TrialOptions(margin=100.0, warmup_steps=1, timed_steps=2)
"""Every divisor shortlisted (so the trial has something to compare), few steps."""


def _auto_measures() -> dict[str, object]:
    """One rank: ``DMPCollection(module, "auto")`` on a ``meta`` model (its weights drawn at sharding, so an
    RNG the trial moved would change them), then the same model at the chosen ``L`` given
    explicitly; both trained 3 steps. Returns the report and how far the two are apart."""
    import torch.distributed as dist

    from sparse2d.advisor.auto_pick import auto_candidates, workload_from_module

    tables = MIXED_TABLES
    kwargs = {"device": "cpu", "constraints": constraints_for(tables), "planner_batch_size": 32}
    module = build_model(tables, device="meta")
    _, shortlist = auto_candidates(
        lambda: workload_from_module(module, 32, None, "intra_host", kwargs["constraints"]),
        dist.get_world_size(),
        torch.device("cpu"),
        dist.group.WORLD,
        QUICK,
    )
    states, rng = [], []
    with DMPCollection(
        build_model(tables, device="meta"), "auto", auto_options=QUICK, **kwargs
    ) as m:
        report = m.trial_report
        rng.append(torch.get_rng_state())
        train(m, tables, 3)
        states.append(flat_state(m.state_dict()))
    with DMPCollection(build_model(tables, device="meta"), report.chosen, **kwargs) as m:
        rng.append(torch.get_rng_state())
        explicit_report = m.trial_report
        train(m, tables, 3)
        states.append(flat_state(m.state_dict()))
    for key, value in states[0].items():
        torch.testing.assert_close(value, states[1][key], rtol=0, atol=0, msg=key)
    return {
        "report": report.as_json(),
        "summary": report.summary(),
        "shortlist": [L for L, _ in shortlist],
        "keys": len(states[0]),
        "same_keys": set(states[0]) == set(states[1]),
        "same_rng": torch.equal(rng[0], rng[1]),
        "explicit_report": explicit_report,
    }


def test_auto_measures_the_shortlist_and_trains_as_the_explicit_l(world4) -> None:
    results = world4.run(_auto_measures, timeout=600)
    first = results[0]["report"]
    assert first["method"] == "measured" and first["why_model"] == ""
    measured = {c["sharding_group_size"]: c["measured_step_s"] for c in first["candidates"]}
    assert sorted(measured) == sorted(results[0]["shortlist"]) == [1, 2, 4]
    assert all(s is not None and s > 0 for s in measured.values()), [
        (c["sharding_group_size"], c["error"]) for c in first["candidates"]
    ]
    assert first["chosen"] == min(measured, key=lambda L: (measured[L], L))
    assert results[0]["summary"].startswith(f"measured: L={first['chosen']} ")
    assert f"| model: L={first['model_pick']}" in results[0]["summary"]
    for r in results:
        assert r["report"]["chosen"] == first["chosen"]  # one L on every rank
        assert r["same_keys"] and r["keys"] > 0 and r["same_rng"]
        assert r["explicit_report"] is None  # an explicit L has nothing to report


def _auto_falls_back() -> list[tuple[int, str, str, int]]:
    """One rank: ``"auto"`` where it must keep the model's pick; (L, method, why, model's L)."""
    import torch.distributed as dist

    from sparse2d import DMPCollection
    from sparse2d.advisor.auto_pick import topology_for_device, workload_from_module
    from sparse2d.advisor.search import recommend_group_size

    tables = MIXED_TABLES
    kwargs = {"device": "cpu", "constraints": constraints_for(tables), "planner_batch_size": 32}
    expected = recommend_group_size(
        workload_from_module(
            build_model(tables, device="meta"), 32, None, "intra_host", kwargs["constraints"]
        ),
        topology_for_device(torch.device("cpu"), dist.get_world_size()),
    )
    calls = [
        {"auto_options": TrialOptions(candidates=0)},
        {"auto_options": QUICK, "custom_all_reduce": lambda tensors: None},
    ]
    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    trial_log = logging.getLogger("sparse2d.advisor.embedding_trial")
    trial_log.addHandler(handler)
    trial_log.setLevel(logging.INFO)
    logging.disable(logging.NOTSET)  # the shared workers mute WARNING (TorchRec's plan chatter)
    out = []
    try:
        for extra in calls:
            with DMPCollection(build_model(tables), "auto", **kwargs, **extra) as model:
                report = model.trial_report
                assert model.sharding_group_size == report.chosen
                out.append((report.chosen, report.method, report.why_model, expected))
    finally:
        logging.disable(logging.WARNING)
        trial_log.removeHandler(handler)
        trial_log.setLevel(logging.NOTSET)
    picked = pick_group_size(  # the choice alone, the model not built
        build_model(tables, device="meta"), auto_options=TrialOptions(candidates=0), **kwargs
    )
    assert (picked.chosen, picked.method) == (expected, "model"), picked.summary()
    said = [
        f"[sparse2d] auto sharding_group_size={L} (model: L={L}; not measured: {why})"
        for L, _, why, _ in out
    ]
    assert lines == (said if dist.get_rank() == 0 else []), lines  # one line, rank 0 only
    return out


def test_auto_keeps_the_model_pick_where_it_cannot_or_may_not_measure(world4) -> None:
    results = world4.run(_auto_falls_back, timeout=600)
    for rank in results:
        assert rank == results[0]
        (opted, _, why_opted, expected), (hooked, _, why_hooked, _) = rank
        assert [m for _, m, _, _ in rank] == ["model", "model"]
        assert opted == hooked == expected
        assert why_opted == "auto_options.candidates=0"
        assert why_hooked.startswith("custom_all_reduce given")


def test_auto_options_must_be_trial_options() -> None:
    assert check_auto_options(None) == TrialOptions()
    with pytest.raises(ConfigError, match=r"auto_options=3 must be a sparse2d.TrialOptions"):
        check_auto_options(3)
    with pytest.raises(ConfigError, match=r"sharding_group_size=2; it only tunes the trial"):
        check_auto_options(QUICK, 2)


def test_auto_options_beside_a_fixed_group_size_is_refused_before_any_collective() -> None:
    """Through the constructor as users call it: refused before the process group is even looked
    for (none exists in this process)."""
    with pytest.raises(ConfigError, match=r"auto_options=.* sharding_group_size=2"):
        DMPCollection(build_model(MIXED_TABLES, device="meta"), 2, auto_options=QUICK)


def test_summary_lists_the_measured_fastest_first_and_the_model_pick() -> None:
    report = TrialReport(
        chosen=2,
        model_pick=4,
        results=[TrialResult(4, 0.01, 0.030), TrialResult(2, 0.02, 0.020)],
        seconds=3.25,
    )
    assert report.summary() == "measured: L=2 20.0 ms, L=4 30.0 ms in 3.2 s | model: L=4"
    report.method, report.why_model = "model", "a plan was given (made for one L)"
    assert report.summary() == "model: L=4; not measured: a plan was given (made for one L)"
