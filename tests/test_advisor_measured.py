"""``measured_group_size``: the library's measured ``auto`` for a caller with a step (world 2:
every shortlisted L measured, the chosen L trains as given explicitly, no trace left)."""

from __future__ import annotations

import torch

from sparse2d.advisor.trial_options import TrialOptions
from tests.models import MIXED_TABLES, build_model, constraints_for


def _library_measured_auto() -> dict[str, object]:
    """One rank: ``measured_group_size`` then the model at its pick, trained 3 steps, vs the
    same model at that L given explicitly (trial-free): equal weights, RNG untouched."""
    import torch.distributed as dist

    from sparse2d import DMPCollection
    from sparse2d.advisor.measured import measured_group_size
    from tests.models import make_batch, train
    from tests.state_views import flat_state

    tables = MIXED_TABLES
    kwargs = {"device": "cpu", "constraints": constraints_for(tables)}

    def step(model: DMPCollection, i: int) -> None:
        kjt, dense, target = make_batch(tables, i, dist.get_rank())
        ((model(kjt, dense) - target) ** 2).mean().backward()
        model.maybe_sync(i)

    torch.manual_seed(11)
    before = torch.get_rng_state()
    options = TrialOptions(margin=100.0, warmup_steps=1, timed_steps=2)
    report = measured_group_size(
        lambda: build_model(tables), step, batch_size_per_rank=8, options=options, **kwargs
    )
    untouched = torch.equal(torch.get_rng_state(), before)
    states = []
    for _ in range(2):  # the chosen L built twice: after the trial, and as a fresh explicit run
        with DMPCollection(build_model(tables), report.chosen, **kwargs) as model:
            train(model, tables, 3)
            states.append(flat_state(model.state_dict()))
    model_only = measured_group_size(
        lambda: build_model(tables),
        step,
        batch_size_per_rank=8,
        options=TrialOptions(candidates=0),
        **kwargs,
    )
    same = all(torch.equal(v, states[1][k]) for k, v in states[0].items())
    return {
        "report": report.as_json(),
        "untouched": untouched,
        "same": same,
        "keys": len(states[0]),
        "model_only": model_only.as_json(),
    }


def test_library_measured_auto_measures_every_shortlisted_l_and_leaves_no_trace(world2) -> None:
    results = world2.run(_library_measured_auto, timeout=600)
    first = results[0]["report"]
    assert [c["sharding_group_size"] for c in first["candidates"]] != []
    assert sorted(c["sharding_group_size"] for c in first["candidates"]) == [1, 2]
    measured = {c["sharding_group_size"]: c["measured_step_s"] for c in first["candidates"]}
    assert first["chosen"] == min(measured, key=lambda L: (measured[L], L))
    # the cost model's pick: the least predicted step (a tie goes to the larger L), which a
    # run with no trial (candidates=0, same workload) must choose
    predicted = {c["sharding_group_size"]: c["predicted_step_s"] for c in first["candidates"]}
    model_pick = min(predicted, key=lambda L: (predicted[L], -L))
    assert first["model_pick"] == model_pick, first
    for r in results:
        assert r["report"]["chosen"] == first["chosen"] and r["untouched"]
        assert r["same"] and r["keys"] > 0
        only = r["model_only"]
        assert only["candidates"] == [] and only["method"] == "model", only
        assert only["chosen"] == only["model_pick"] == model_pick, (only, predicted)
