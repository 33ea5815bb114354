"""Measured ``auto`` vs the best fixed ``L``: is the trial's pick never far from the best?

Per series (world 4; the world-8 series of ``planner_holdout.py`` need 8 processes on this
2-core box and are left out): the cost model's prediction for every ``L`` (computed here, as
``bench/planner_fit.py`` reads a series), the shortlist (``sparse2d.advisor.trial.shortlist``,
default options), then in one fresh gloo world:

1. the trial, exactly as ``sharding_group_size="auto"`` runs it
   (``measure_group_sizes``: each shortlisted ``L`` built, ``2 + 5`` steps on the first batches,
   closed) -> the ``L`` auto trains at, and the trial's seconds;
2. the reference: models for every ``L`` built side by side, ``--rounds`` rounds of
   ``--steps`` steps alternating ``L`` (``planner_holdout.py``'s harness and timing: the
   slowest rank's median step) -> the best fixed ``L``.

3. the library door: ``DMPCollection(module, "auto")`` as a user calls it (the series' module,
   its sharding types as constraints, ``planner_batch_size``; no step given), which times the
   shortlist on the module's embedding part with generated inputs
   (``sparse2d.advisor.embedding_trial``) -> the ``L`` the door builds, and whether it measured.

Reported per series: auto's ``L`` and its reference step over the best (goal <= 1.05), the
door's and the model-only pick's regret beside it. The door's candidates keep the series'
sharding types at every ``L`` (a user gives one set of constraints), where the reference
builds ``L=1`` table-wise. The series: ``bench/``'s fit set and held-out set at world 4,
three NEW workloads (``NEW_SERIES``, 2026-11-25) and three more (``NEW_SERIES_1128``,
2026-11-28, never used anywhere before this run), each measured for this report and never
used to change the model (the model's out-of-sample error on them is reported as it is).
``--main-job`` adds one 1000-step trainer run of ``configs/tiny_cpu.yaml`` with
``auto``: the trial's seconds over the run's wall time (goal <= 10%).

Run: ``PYTHONPATH=. .venv/bin/python bench/auto_bench.py [--main-job]`` (~20 min on 2 cores).
Writes ``bench/results/auto.json`` and the ``auto`` section of ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_util import RESULTS_DIR, publish, spawn, timed  # noqa: E402
from planner_holdout import FIT_SERIES, SERIES, Series, _batch, _build, _model, _sharders  # noqa: E402

NEW_SERIES: tuple[Series, ...] = (
    Series("new_big_tables_small_batch", 4, ((4, 200_000, 32, "table_wise"),), 64),
    Series("new_rw_tw_dim16", 4, ((2, 50_000, 16, "row_wise"), (6, 3_000, 16, "table_wise")), 256),
    Series("new_tw_dim64", 4, ((8, 5_000, 64, "table_wise"),), 512),
)
"""Three workloads in neither the fit nor the held-out set, measured once (2026-11-25)."""

NEW_1128 = "new 2026-11-28"
"""The set name of ``NEW_SERIES_1128`` in the report."""

NEW_SERIES_1128: tuple[Series, ...] = (
    Series("new1128_rw12x2k_d16_b1024", 4, ((12, 2_000, 16, "row_wise"),), 1024),
    Series("new1128_tw6x8k_d64_b1024", 4, ((6, 8_000, 64, "table_wise"),), 1024),
    Series(
        "new1128_rw2x30k_tw4x3k_d32_b1024",
        4,
        ((2, 30_000, 32, "row_wise"), (4, 3_000, 32, "table_wise")),
        1024,
    ),
)
"""Three more held-out workloads for the library door's regret, never used anywhere before
(2026-11-28). Picked (from candidates whose model advice alone was looked at, never a
measurement) where the model's shortlist holds all three L, so a trial can change the pick:
many small row-wise tables, wide table-wise rows, and row-wise beside table-wise tables, all
under a large batch."""


def advice_for(series: Series) -> Any:
    """The shipped model's ``Advice`` on the series as the harness builds it at each ``L``
    (``planner_fit.series_workload`` / ``series_topology``: table-wise at L=1)."""
    from planner_fit import series_topology, series_workload

    from sparse2d.advisor.cost_model import AnalyticCostModel
    from sparse2d.advisor.search import Advice, default_planner
    from sparse2d.mesh import divisors

    candidates = tuple(
        AnalyticCostModel(
            series_workload(series, L), series_topology(series, L), default_planner()
        ).estimate(L)
        for L in divisors(series.world)
    )
    fitting = [c for c in candidates if c.fits]
    best = min(fitting, key=lambda c: (c.step_s, -c.sharding_group_size))
    return Advice(series.world, "cpu_gloo", candidates, best.sharding_group_size, "")


def _step(series: Series, model: Any, i: int, rank: int) -> None:
    model(_batch(series, i, rank)).values().square().mean().backward()
    model.sync()


def _door(series: Series) -> dict[str, Any]:
    """The library door as a user calls it: the series' module, its sharding types as
    constraints, its batch as ``planner_batch_size``; the report of the ``L`` it built."""
    from torchrec.distributed.planner.types import ParameterConstraints

    from sparse2d import DMPCollection
    from sparse2d.sync.policy import SyncOptions

    constraints = {
        n: ParameterConstraints(sharding_types=[s]) for n, _, _, s in series.table_list()
    }
    begin = time.perf_counter()
    with DMPCollection(
        _model(series),
        "auto",
        device="cpu",
        constraints=constraints,
        sharders=_sharders(series),
        planner_batch_size=series.batch,
        sync_options=SyncOptions(engine="dense"),
    ) as model:
        report = model.trial_report.as_json()
    return {**report, "door_s": time.perf_counter() - begin}


def _rank(
    series: Series, shortlist: list, pick: int, rounds: int, steps: int, options: Any
) -> dict[str, Any]:
    """One rank of ``measure_series`` (run by ``bench_util.spawn``): the trial's report and
    the reference, the slowest rank's median step per L."""
    import torch.distributed as dist

    from sparse2d.advisor.trial import measure_group_sizes
    from sparse2d.mesh import divisors

    rank, world = dist.get_rank(), dist.get_world_size()
    report = measure_group_sizes(
        lambda L: _build(series, L),
        lambda m, i: _step(series, m, i, rank),
        shortlist,
        options,
        model_pick=pick,
    )
    door = _door(series)
    models = {L: _build(series, L) for L in divisors(world)}
    times: dict[int, list[float]] = {L: [] for L in models}
    step = 1000  # past the trial's batches
    for r in range(rounds + 1):  # round 0 warms up every L
        order = list(models) if r % 2 else list(reversed(models))
        for L in order:
            for _ in range(steps):
                dist.barrier()
                begin = time.perf_counter()
                _step(series, models[L], step, rank)
                step += 1
                if r:
                    times[L].append(time.perf_counter() - begin)
    for model in models.values():
        model.close()
    mine = {L: statistics.median(t) for L, t in times.items()}
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine)
    return {
        "trial": report.as_json(),
        "door": door,
        "reference": {L: max(g[L] for g in gathered) for L in mine},
    }


def measure_series(series: Series, rounds: int, steps: int, options: Any) -> dict[str, Any]:
    from sparse2d.advisor.trial import shortlist

    advice = advice_for(series)
    short = shortlist(advice, options)
    load = os.getloadavg()[0]
    result = spawn(series.world, _rank, series, short, advice.recommended, rounds, steps, options)
    ref = result["reference"]
    best = min(ref, key=lambda L: ref[L])
    chosen, pick = result["trial"]["chosen"], advice.recommended
    return {
        "predicted": {c.sharding_group_size: c.step_s for c in advice.candidates},
        "shortlist": [L for L, _ in short],
        "trial": result["trial"],
        "reference_step_s": ref,
        "best_fixed": best,
        "auto": chosen,
        "auto_over_best": ref[chosen] / ref[best],
        "model_pick": pick,
        "model_over_best": ref[pick] / ref[best],
        "door_trial": result["door"],
        "door": result["door"]["chosen"],
        "door_over_best": ref[result["door"]["chosen"]] / ref[best],
        "load": (load, os.getloadavg()[0]),
    }


def main_job(steps: int) -> dict[str, Any]:
    """One trainer run of the main job with ``auto``: trial seconds over the run's wall."""
    import tempfile

    from main_job_bench import run_trainer

    with tempfile.TemporaryDirectory() as tmp:
        begin = time.perf_counter()
        summary = run_trainer(["parallel.sharding_group_size=auto"], steps, tmp)
        wall = time.perf_counter() - begin
    trial = summary["auto_trial"]
    return {
        "steps": steps,
        "wall_s": wall,
        "train_s": summary["train_s"],
        "trial_s": trial["trial_s"],
        "trial": trial,
        "sharding_group_size": summary["sharding_group_size"],
        "samples_per_s": summary["samples_per_s"],
    }


def trial_options(args: argparse.Namespace) -> Any:
    """The shipped defaults unless ``--warmup``/``--timed`` say otherwise."""
    from sparse2d.advisor.trial import TrialOptions

    default = TrialOptions()
    return TrialOptions(
        warmup_steps=default.warmup_steps if args.warmup is None else args.warmup,
        timed_steps=default.timed_steps if args.timed is None else args.timed,
    )


def measure(args: argparse.Namespace) -> dict[str, Any]:
    groups = {
        "fit": [s for s in FIT_SERIES if s.world == 4],
        "held-out": [s for s in SERIES if s.world == 4],
        "new": list(NEW_SERIES),
        NEW_1128: list(NEW_SERIES_1128),
    }
    result: dict[str, Any] = {"series": {}, "rounds": args.rounds, "steps": args.steps}
    for kind, series in groups.items():
        for s in series:
            if args.only and s.name not in args.only:
                continue
            try:
                entry = measure_series(s, args.rounds, args.steps, trial_options(args))
            except Exception as error:  # recorded, not hidden
                entry = {"error": repr(error)[:300]}
            result["series"][s.name] = {"set": kind, **entry}
            print(
                s.name,
                {
                    k: entry.get(k)
                    for k in (
                        "auto",
                        "best_fixed",
                        "auto_over_best",
                        "model_pick",
                        "model_over_best",
                        "door",
                        "door_over_best",
                    )
                },
                flush=True,
            )
    if args.main_job:
        result["main_job"] = main_job(1000)
    return result


def _measured(candidate: dict[str, Any]) -> str:
    """``L: ms``; a re-measured near-tie adds both passes (the lower is kept)."""
    if not candidate["measured_step_s"]:
        return f"{candidate['sharding_group_size']}: failed"
    text = f"{candidate['sharding_group_size']}: {1e3 * candidate['measured_step_s']:.1f}"
    passes = [p for p in candidate.get("passes_step_s", []) if p is not None]
    if len(passes) > 1:
        text += " (" + " / ".join(f"{1e3 * p:.1f}" for p in passes) + ")"
    return text


def _trial_shape(result: dict[str, Any]) -> str:
    """The trial's steps and re-trial rule, as the saved run recorded them."""
    trial = next(iter(result["series"].values()))["trial"]
    text = f"{trial['warmup_steps']} warm-up + {trial['timed_steps']} timed steps each"
    margin = trial.get("retrial_margin", 0.0)
    if margin:
        text += (
            f", the candidates within {margin:g} of the fastest measured again in "
            "reverse order, each keeping its lower time; both passes in brackets"
        )
    return text


def _door_cells(e: dict[str, Any]) -> str:
    """The door's columns: its ``L`` (measured or the model's), regret, trial, seconds."""
    door = e.get("door_trial")
    if door is None:
        return "- | - | - | -"
    how = "measured" if door["method"] == "measured" else f"model: {door['why_model']}"
    trial = ", ".join(_measured(c) for c in door["candidates"]) or "-"
    return f"{e['door']} ({how}) | {e['door_over_best']:.3f} | {trial} | {door['door_s']:.1f}"


def _door_sentence(ok: list[dict[str, Any]]) -> str:
    """The door's regret beside the trainer's, over every series and on the new ones."""
    doors = [e for e in ok if "door_trial" in e]
    if not doors:
        return "The library door was not measured in this run."
    measured = sum(e["door_trial"]["method"] == "measured" for e in doors)
    new = [e for e in doors if e["set"].startswith("new")]
    pairs = ", ".join(f"{e['door_over_best']:.3f} ({e['auto_over_best']:.3f})" for e in new)
    return (
        f'Library door (`DMPCollection(module, "auto")`, the embedding part timed on '
        f"generated inputs): measured on {measured} of {len(doors)} series; within 1.05 of the "
        f"best fixed L on {sum(e['door_over_best'] <= 1.05 for e in doors)} of {len(doors)}, "
        f"worst {max(e['door_over_best'] for e in doors):.3f}, median door seconds "
        f"{statistics.median(e['door_trial']['door_s'] for e in doors):.1f}. On the new "
        f"workloads door/best (trainer's auto/best): {pairs}."
    )


def markdown(result: dict[str, Any], args: argparse.Namespace, wall: float) -> str:
    lines = [
        "## Measured auto vs the best fixed L (bench/auto_bench.py)",
        "",
        f"World 4 gloo CPU, one fresh world per series. `auto` = the trial as shipped "
        f"(shortlist: within 1.5x of the model's best, at most 3; {_trial_shape(result)}). "
        f"Reference: every L built side by side, {result['rounds']} rounds x "
        f"{result['steps']} steps alternating L, slowest rank's median step. "
        f"{args.machine}; single ratios move by 10-30% between runs on this box. "
        f"Wall {wall:.0f} s.",
        "",
        "| set | series | predicted ms (L: step) | shortlist | trial measured ms | trial s "
        "| best fixed L (ref ms) | auto L | auto/best | model L | model/best "
        "| door L | door/best | door measured ms | door s |",
        "|---|---|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for name, e in result["series"].items():
        if "error" in e:
            lines.append(f"| {e['set']} | {name} | failed: {e['error']} |")
            continue
        pred = ", ".join(f"{L}: {1e3 * s:.1f}" for L, s in e["predicted"].items())
        trial = ", ".join(_measured(c) for c in e["trial"]["candidates"])
        ref = e["reference_step_s"]
        best = e["best_fixed"]
        lines.append(
            f"| {e['set']} | {name} | {pred} | {e['shortlist']} | {trial} | "
            f"{e['trial']['trial_s']:.1f} | {best} ({1e3 * ref[best]:.1f}) | {e['auto']} | "
            f"{e['auto_over_best']:.3f} | {e['model_pick']} | {e['model_over_best']:.3f} | "
            + _door_cells(e)
            + " |"
        )
    ok = [e for e in result["series"].values() if "error" not in e]
    within = sum(e["auto_over_best"] <= 1.05 for e in ok)
    new = [e for e in ok if e["set"].startswith("new")]
    errors = [
        (name, L, e["predicted"][L] / e["reference_step_s"][L])
        for name, e in result["series"].items()
        if "error" not in e and e["set"].startswith("new")
        for L in e["reference_step_s"]
    ]
    lines += [
        "",
        _door_sentence(ok),
        "",
        f"auto within 1.05 of the best fixed L on {within} of {len(ok)} series; worst "
        f"{max((e['auto_over_best'] for e in ok), default=float('nan')):.3f}. Model-only pick: "
        f"within 1.05 on {sum(e['model_over_best'] <= 1.05 for e in ok)} of {len(ok)}; on the "
        f"new workloads its regret is "
        + ", ".join(f"{e['model_over_best']:.3f}" for e in new)
        + ".",
        "",
        "The model out of sample (new workloads, measured once, the model unchanged): "
        "predicted / measured step per L: "
        + "; ".join(f"{n} L={L} {r:.2f}" for n, L, r in errors)
        + (
            f" (mean |error| {statistics.mean(abs(r - 1) for _, _, r in errors):.0%})."
            if errors
            else "."
        ),
    ]
    if "main_job" in result:
        m = result["main_job"]
        lines.append(
            f"Main job (`configs/tiny_cpu.yaml`, `auto`, 1000 steps through the trainer): the "
            f"trial took {m['trial_s']:.1f} s of a {m['wall_s']:.0f} s run "
            f"({100 * m['trial_s'] / m['wall_s']:.1f}% of the wall; "
            f"{100 * m['trial_s'] / m['train_s']:.1f}% of the training loop's "
            f"{m['train_s']:.0f} s), and trained at L={m['sharding_group_size']}."
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--main-job", action="store_true")
    parser.add_argument("--warmup", type=int, help="trial warm-up steps (default: shipped)")
    parser.add_argument("--timed", type=int, help="trial timed steps (default: shipped)")
    parser.add_argument("--only", nargs="*", help="series names (default all)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-results-md", action="store_true")
    parser.add_argument("--render", metavar="JSON", help="re-render a saved run, no measuring")
    args = parser.parse_args(argv)
    if args.render:
        import json

        result = json.loads(Path(args.render).read_text())
        for e in result["series"].values():  # JSON turned the L keys into text
            for key in ("predicted", "reference_step_s"):
                if key in e:
                    e[key] = {int(L): v for L, v in e[key].items()}
        args.machine = result.get("machine", "load not recorded")
        publish(
            args, result, markdown(result, args, result.get("wall_s", 0.0)), "auto.json", "auto"
        )
        return 0
    result, wall = timed(args, measure, args)
    result["machine"], result["wall_s"] = args.machine, wall
    publish(args, result, markdown(result, args, wall), "auto.json", "auto")
    return 0


if __name__ == "__main__":
    sys.exit(main())
