"""The evidence that retired the measured ``auto`` trial: the stored run, rendered.

Until issue 66 ``sharding_group_size="auto"`` shortlisted ``L`` with the cost model and, where
the shortlist held more than one, timed each with a few trial steps (the trainer on its own
job, ``DMPCollection(module, "auto")`` on the module's embedding part). The run
(``bench/results/auto.json``: world 4, gloo CPU, per series the model's prediction, its
shortlist, the trainer's trial, the library door's, and a reference of every ``L`` built
side by side) found the model-only pick as close to the best fixed ``L`` as either trial and
the trials costing seconds per launch, so the trial was retired: ``auto`` is the cost model's
pick. The script that measured it is gone with the code (``git show
a2ba2cf:bench/auto_bench.py``, ``LAST_WITH_CODE``); this one renders the stored run into the ``auto`` section
of ``bench/RESULTS.md``, every figure computed from the JSON.

Run: ``PYTHONPATH=. .venv/bin/python bench/auto_bench.py``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_util import RESULTS_DIR, publish, stored_stamp  # noqa: E402

MARKER = "auto"
HEADING = "Measured auto vs the best fixed L (bench/auto_bench.py, retired)"
LAST_WITH_CODE = "a2ba2cf"
"""The last commit with the trial and the measuring script (issue 66 retired both after it)."""
NEW_1128 = "new 2026-11-28"
"""The set name of the three workloads added on 2026-11-28 (never used before that run)."""
GOAL = 1.05
"""A pick within this factor of the best fixed ``L`` counts as right."""


def over_best(e: dict[str, Any], L: int) -> float:
    """``L``'s reference step over the best fixed ``L``'s, from the stored reference steps."""
    ref = e["reference_step_s"]
    return ref[L] / min(ref.values())


def regret(result: dict[str, Any], pick: str) -> tuple[int, int, float]:
    """(series within ``GOAL``, series, worst ratio) of one way to pick ``L`` (``model_pick``,
    ``auto``: the trainer's trial, ``door``: the library door's)."""
    ok = [e for e in result["series"].values() if "error" not in e]
    ratios = [over_best(e, e[pick]) for e in ok]
    return sum(r <= GOAL for r in ratios), len(ratios), max(ratios)


def retirement(result: dict[str, Any]) -> str:
    """The paragraph that says why the trial went, with the figures of the stored run."""
    ok = [e for e in result["series"].values() if "error" not in e]
    new = [e for e in ok if e["set"].startswith("new")]
    doors = statistics.median(e["door_trial"]["door_s"] for e in ok)
    said = {
        pick: "within {} of the best fixed L on {} of {} series (worst {:.3f})".format(
            GOAL, *regret(result, pick)
        )
        for pick in ("model_pick", "auto", "door")
    }
    newest = f"{max(over_best(e, e['model_pick']) for e in new):.3f}"
    newest = f"{newest} on all" if newest == "1.000" else f"at most {newest} on the"
    main = result["main_job"]["trial_s"]
    return (
        f"**Retired (issue 66).** This run is why `auto` is now the cost model's pick alone. "
        f"The model-only pick was {said['model_pick']}, and {newest} "
        f"{len(new)} new workloads; the trainer's measured trial {said['auto']}; the library "
        f"door's measured pick {said['door']}. The trial cost seconds per launch (median door "
        f"{doors:.1f} s; the trainer's on the main job {main:.1f} s) and built trial "
        "DMPCollections inside the constructor, while timing noise on this 2-core box "
        "(10-30% between runs) swamps the differences it tried to see. So the trial, "
        "`TrialOptions`, `measured_group_size` and `TrialError` were removed; the door's "
        "`auto_options` and the trainer's `parallel.auto` are refused with a line naming this "
        f"section. The run below is the stored evidence (the script that measured it: "
        f"`git show {LAST_WITH_CODE}:bench/auto_bench.py`)."
    )


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


def markdown(result: dict[str, Any]) -> str:
    wall = result.get("wall_s", 0.0)
    lines = [
        f"## {HEADING}",
        "",
        retirement(result),
        "",
        f"World 4 gloo CPU, one fresh world per series. `auto` = the trial as it shipped "
        f"(shortlist: within 1.5x of the model's best, at most 3; {_trial_shape(result)}). "
        f"Reference: every L built side by side, {result['rounds']} rounds x "
        f"{result['steps']} steps alternating L, slowest rank's median step. "
        f"{result.get('machine', 'load not recorded')}; single ratios move by 10-30% between runs on this box. "
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


def load(path: Path) -> dict[str, Any]:
    """The stored run, its ``L`` keys back to numbers (JSON turned them into text)."""
    result = json.loads(path.read_text())
    for e in result["series"].values():
        for key in ("predicted", "reference_step_s"):
            if key in e:
                e[key] = {int(L): v for L, v in e[key].items()}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="where auto.json is")
    parser.add_argument("--no-results-md", action="store_true")
    args = parser.parse_args(argv)
    result = load(args.out / "auto.json")
    publish(args, result, markdown(result), "auto.json", MARKER, stored_stamp(MARKER, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
