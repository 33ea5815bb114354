"""``sync.engines.choice``: the decision of ``engine="auto"`` alone, on simulated workloads whose
real costs differ from the model (no process group; measurements land one sync late, like
the engine's piggybacked times)."""

from __future__ import annotations

import pytest

from sparse2d.sync.engines.choice import DENSE, EXPLORE_RATIO, SPARSE, CostFit, ModeChooser


def _simulate(model: dict[str, float], true: dict[str, float], syncs: int) -> tuple[list, dict]:
    """Run ``syncs`` decisions on a steady workload whose real costs differ from the model;
    measurements land one sync late, like the engine's piggybacked times."""
    chooser, modes, spent, late = ModeChooser(), [], 0.0, None
    for _ in range(syncs):
        mode = chooser.choose(model)
        if late is not None:
            chooser.refine(*late)
        late = (mode, model[mode], true[mode])
        modes.append(mode)
        spent += true[mode]
    return modes, {"chooser": chooser, "spent": spent, "best": syncs * min(true.values())}


@pytest.mark.parametrize(
    ("true", "home"),
    [
        # the model is wrong about which is cheaper (dense 2.5x: not worth re-measuring)
        ({DENSE: 1.0, SPARSE: 0.4}, SPARSE),
        # a busy host: every collective costs 10x the probe (sparse has 3, dense 1)
        ({DENSE: 10.0, SPARSE: 30.0}, DENSE),
        # copies far slower than probed: the dense mode moves most bytes
        ({DENSE: 9.0, SPARSE: 2.0}, SPARSE),
    ],
)
def test_chooser_learns_the_cheaper_mode_within_5_percent(true: dict, home: str) -> None:
    model = {DENSE: 1.0, SPARSE: 1.5}  # the model's guess: dense a little cheaper
    modes, r = _simulate(model, true, 300)
    assert r["chooser"].home == home and modes[-1] == home, modes
    worse = max(true.values()) - min(true.values())
    assert r["spent"] - r["best"] <= 5 * worse, (modes, r)  # learning: a few syncs at most
    _, steady = _simulate(model, true, 1000)  # then exploring costs < 2% of the sync time
    assert steady["spent"] - r["spent"] - 700 * min(true.values()) <= 0.02 * 700 * max(
        true.values()
    ), (steady, r)


def test_chooser_never_tries_a_mode_predicted_far_dearer() -> None:
    """10^6-row Zipf tables: a dense sync costs 60x the touched rows; never run it."""
    modes, r = _simulate({DENSE: 60.0, SPARSE: 1.0}, {DENSE: 60.0, SPARSE: 3.0}, 300)
    assert DENSE not in modes and r["chooser"].explored == 0, modes


def test_chooser_explores_only_within_the_ratio_and_backs_off() -> None:
    model = {DENSE: 1.0, SPARSE: 1.0}
    modes, r = _simulate(model, {DENSE: 1.0, SPARSE: 1.5}, 300)
    explored = modes.count(SPARSE)  # the model ties: dense (first) is home and stays home
    assert r["chooser"].home == DENSE and r["chooser"].explored == explored, modes
    assert 3 <= explored <= 8, modes  # intervals double: 4, 8, ... 256
    assert 1.5 < EXPLORE_RATIO  # so exploring is allowed in this case at all


def test_chooser_forgets_a_stale_measurement_of_the_other_mode() -> None:
    """The workload changed under it: dense used to cost what touched rows cost, now 2.5x.
    One exploration of dense must be enough (averaging the fresh measurement with the stale
    one would keep dense "within 2x" for three more explorations)."""
    chooser, model = ModeChooser(), {DENSE: 1.0, SPARSE: 1.0}
    chooser.refine(DENSE, 1.0, 1.0)  # learnt earlier
    chooser.refine(SPARSE, 1.0, 1.0)
    chooser.home, late, dense_syncs = SPARSE, None, 0
    for _ in range(120):
        mode = chooser.choose(model)
        if late is not None:
            chooser.refine(*late)
        late = (mode, model[mode], {DENSE: 2.5, SPARSE: 1.0}[mode])
        dense_syncs += mode == DENSE
    assert chooser.home == SPARSE and dense_syncs == 1, (dense_syncs, chooser.fits)


def test_chooser_carries_a_fixed_cost_across_union_sizes() -> None:
    """Touched rows cost 8 ms fixed (3 collectives, Python) + the modelled bytes. Learnt at
    tiny unions, a measured/modelled ratio (40x) would price large unions at 40x their bytes
    and pick dense; the fitted fixed cost carries over."""
    chooser, late, homes, dense_syncs = ModeChooser(), None, set(), 0
    for step in range(200):
        touched = 0.2 if step < 100 else 20.0  # the union grows 100x at step 100
        model = {DENSE: 40.0, SPARSE: touched}
        mode = chooser.choose(model)
        if late is not None:
            chooser.refine(*late)
        late = (mode, model[mode], {DENSE: 50.0, SPARSE: 8.0 + touched}[mode])
        if step >= 100:
            homes.add(chooser.home)
            dense_syncs += mode == DENSE
    # never switched to dense (28 vs 50 ms); dense re-measured a few times (within 2x)
    assert homes == {SPARSE} and dense_syncs <= 5, (homes, dense_syncs, chooser.fits)


def test_cost_fit_learns_fixed_then_slope() -> None:
    fit = CostFit()
    for _ in range(5):
        fit.add(1.0, 9.0)  # one workload: fixed cost only
    assert fit.slope() == 1.0 and fit.predict(3.0) == pytest.approx(11.0)
    for x in (1.0, 4.0, 1.0, 4.0, 1.0, 4.0):
        fit.add(x, 5.0 + 3.0 * x)  # varied workloads: the bytes cost 3x the model
    assert fit.slope() == pytest.approx(3.0, rel=0.05)
    assert fit.predict(10.0) == pytest.approx(35.0, rel=0.05)
    over = CostFit()
    for _ in range(3):
        over.add(100.0, 2.0)  # the model over-prices 50x: scale, no negative fixed part
    assert over.slope() == pytest.approx(0.02) and over.predict(50.0) == pytest.approx(1.0)
