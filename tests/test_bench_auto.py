"""bench/auto_bench.py and bench/main_job_layouts.py: their reports rendered from the saved runs
(auto_bench renders the stored run that retired the measured ``auto`` trial; main_job_layouts'
measurements spawn worlds for minutes)."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
import auto_bench
import main_job_layouts

BENCH = Path(tests.bench_path.BENCH)
STORED = BENCH / "results" / "auto.json"


def _figures(result: dict, pick: str) -> tuple[int, int, float]:
    """Within 1.05, series, worst: from the reference steps, apart from the script's code."""
    ratios = []
    for e in result["series"].values():
        ref = {int(L): v for L, v in e["reference_step_s"].items()}
        ratios.append(ref[e[pick]] / min(ref.values()))
    return sum(r <= 1.05 for r in ratios), len(ratios), max(ratios)


def test_the_stored_run_holds_every_series_and_its_ratios_are_its_reference_steps() -> None:
    saved = json.loads(STORED.read_text())
    kinds = {e["set"] for e in saved["series"].values()}
    assert kinds == {"fit", "held-out", "new", auto_bench.NEW_1128}
    assert sum(e["set"].startswith("new") for e in saved["series"].values()) == 6
    for e in saved["series"].values():
        ref = {int(L): v for L, v in e["reference_step_s"].items()}
        for pick, ratio in (("auto", "auto_over_best"), ("model_pick", "model_over_best")):
            assert e[ratio] == ref[e[pick]] / min(ref.values())
        assert e["door_over_best"] == ref[e["door"]] / min(ref.values())
        assert e["trial"]["chosen"] == e["auto"] and e["shortlist"][0] == e["model_pick"]


def test_the_retirement_paragraph_states_the_stored_figures_and_the_docs_quote_them() -> None:
    """The reason the trial went: the model-only pick as close to the best fixed L as either
    trial. Every figure is recomputed here from the reference steps, so a wrong ratio in the
    script (or a docs page quoting another run) fails."""
    result = auto_bench.load(STORED)
    text = auto_bench.retirement(result)
    model, trainer, door = (_figures(result, p) for p in ("model_pick", "auto", "door"))
    for within, total, worst in (model, trainer, door):
        assert f"on {within} of {total} series (worst {worst:.3f})" in text
    assert model[0] >= max(trainer[0], door[0]) and model[2] <= min(trainer[2], door[2])
    assert "1.000 on all 6 new workloads" in text
    assert f"main job {result['main_job']['trial_s']:.1f} s" in text
    docs = " ".join((BENCH.parent / "docs" / "advisor.md").read_text().split())
    for within, total, worst in (model, trainer, door):
        assert f"{within} of {total} (worst {worst:.3f})" in docs


def test_a_wrong_reference_step_changes_the_rendered_figures() -> None:
    result = auto_bench.load(STORED)
    wrong = copy.deepcopy(result)
    series = wrong["series"]["new_tw_dim64"]  # the model picked the best L (4) there
    series["reference_step_s"][4] *= 3.0
    assert auto_bench.retirement(wrong) != auto_bench.retirement(result)
    assert "1.000 on all 6 new workloads" not in auto_bench.retirement(wrong)


def _section(path: Path, marker: str) -> str:
    """A RESULTS.md section's body without its environment stamp."""
    text = path.read_text()
    return text[
        text.index(f"<!-- {marker}:begin -->") : text.index(f"<!-- {marker}:end -->")
    ].split("\n\n_Environment:")[0]


def test_auto_section_is_exactly_what_the_script_renders(tmp_path) -> None:
    """No hand-written text inside the script's section: rendering the stored run again
    reproduces it (the stamp aside), and marks it retired."""
    shutil.copy(STORED, tmp_path / "auto.json")
    assert auto_bench.main(["--out", str(tmp_path)]) == 0
    assert _section(tmp_path / "RESULTS.md", "auto") == _section(BENCH / "RESULTS.md", "auto")
    assert f"## {auto_bench.HEADING}" in _section(BENCH / "RESULTS.md", "auto")
    assert "retired" in auto_bench.HEADING


def test_main_job_layouts_sentence_is_what_the_readme_quotes() -> None:
    saved = json.loads((BENCH / "results" / "main_job_layouts.json").read_text())
    text = main_job_layouts.sentence(saved)
    readme = (BENCH.parent / "README.md").read_text()
    best = {L: max(v) for L, v in saved["samples_per_s"].items()}
    figure = f"{best['2'] / best['1']:.2f}x the"
    assert figure in text and figure in " ".join(readme.split())
    assert f"{saved['full']['2']['eval_auc']:.4f} in 2D" in " ".join(readme.split())
    assert "6 tables" in main_job_layouts.shape()


def test_main_job_layouts_repeat_is_rendered_from_its_json() -> None:
    saved = json.loads((BENCH / "results" / "main_job_layouts.json").read_text())
    repeat = json.loads((BENCH / "inputs" / "main_job_layouts_repeat.json").read_text())
    text = main_job_layouts.repeat_paragraph(saved, repeat)
    assert "L=2 beat L=1 in 6 of 7 rounds" in text  # 2 of 3 + 4 of 4, counted from the rounds
    assert text in (BENCH / "RESULTS.md").read_text()


def test_main_job_candidates_section_is_what_the_script_renders() -> None:
    """The candidates tried for a main job where 2D is the fastest L: the RESULTS.md section
    is the script's rendering of the saved runs, and none of them had L=2 fastest."""
    paths = sorted((BENCH / "inputs" / "main_job_candidates").glob("*.json"))
    assert len(paths) >= 6
    text = main_job_layouts.candidates_section(paths)
    assert text == _section(BENCH / "RESULTS.md", "main-job-candidates").split("\n", 1)[1]
    assert f"in 0 of {len(paths)} candidates" in text
    for path in paths:
        saved = json.loads(path.read_text())
        assert {len(v) for v in saved["samples_per_s"].values()} == {saved["rounds"]}
        assert all("load" in run for runs in saved["runs"].values() for run in runs)
