"""bench/auto_bench.py and bench/main_job_layouts.py: their reports rendered from the saved runs
(the measurements themselves spawn worlds for ~20 minutes; the trial they run is
``sparse2d.advisor.trial``, tested in tests/test_advisor_trial.py and test_train_auto_trial.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
import auto_bench
import main_job_layouts

BENCH = Path(tests.bench_path.BENCH)


def test_auto_report_renders_every_series_from_the_saved_run(tmp_path) -> None:
    saved = json.loads((BENCH / "results" / "auto.json").read_text())
    assert (
        auto_bench.main(
            [
                "--render",
                str(BENCH / "results" / "auto.json"),
                "--out",
                str(tmp_path),
                "--no-results-md",
            ]
        )
        == 0
    )
    rendered = json.loads((tmp_path / "auto.json").read_text())
    assert rendered["series"].keys() == saved["series"].keys()
    kinds = {e["set"] for e in saved["series"].values()}
    assert kinds == {"fit", "held-out", "new", auto_bench.NEW_1128}
    assert sum(e["set"] == "new" for e in saved["series"].values()) == 3
    assert sum(e["set"] == auto_bench.NEW_1128 for e in saved["series"].values()) == 3
    for e in saved["series"].values():
        ref = {int(L): v for L, v in e["reference_step_s"].items()}
        assert e["auto_over_best"] == ref[e["auto"]] / min(ref.values())
        assert e["trial"]["chosen"] == e["auto"] and e["shortlist"][0] == e["model_pick"]
        door = e["door_trial"]  # the library door, as a user calls it
        assert e["door_over_best"] == ref[e["door"]] / min(ref.values())
        assert door["chosen"] == e["door"] and door["method"] in ("measured", "model")
        if door["method"] == "measured":
            assert e["door"] in [c["sharding_group_size"] for c in door["candidates"]]
        else:
            assert door["candidates"] == [] and door["why_model"]
    shipped = auto_bench.trial_options(argparse.Namespace(warmup=None, timed=None))
    for e in saved["series"].values():  # the run used the trial as shipped
        trial = e["trial"]
        assert (trial["warmup_steps"], trial["timed_steps"]) == (
            shipped.warmup_steps,
            shipped.timed_steps,
        )
        assert trial["retrial_margin"] == shipped.retrial_margin


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


def _section(path: Path, marker: str) -> str:
    """A RESULTS.md section's body without its environment stamp."""
    text = path.read_text()
    return text[
        text.index(f"<!-- {marker}:begin -->") : text.index(f"<!-- {marker}:end -->")
    ].split("\n\n_Environment:")[0]


def test_auto_section_is_exactly_what_the_script_renders(tmp_path) -> None:
    """No hand-written text inside the script's section: rendering the saved run again
    reproduces it (the stamp aside, which names the commit of the render)."""
    assert (
        auto_bench.main(["--render", str(BENCH / "results" / "auto.json"), "--out", str(tmp_path)])
        == 0
    )
    assert _section(tmp_path / "RESULTS.md", "auto") == _section(BENCH / "RESULTS.md", "auto")


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
