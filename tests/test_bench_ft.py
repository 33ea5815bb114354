"""``bench/ft_bench.py``'s rendering: the interval it reports and a re-render that keeps the
measurement's own stamp and shape (commit, versions, steps, rounds), not the renderer's."""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import pytest

from bench import ft_bench
from bench.bench_util import bench_environment, publish, stored_stamp
from bench.ft_report import T_975, _interval_text, clean_markdown


def test_the_interval_is_students_t_around_the_mean_ratio() -> None:
    ratios = [0.97, 0.975, 0.92, 0.935]
    mean, sd = statistics.mean(ratios), statistics.stdev(ratios)
    half = 3.182 * sd / 2  # t(0.975, 3 df) from a printed table, n = 4
    text = _interval_text(ratios)
    assert f"mean of the per-round ratios {mean:.3f}" in text
    assert f"95% interval {mean - half:.3f}-{mean + half:.3f} (t, 3 df)" in text
    assert "2 of 4 rounds >= 0.95" in text
    assert T_975[0] == 12.706 and _interval_text([0.9]).endswith("0.900")  # one round: no sd


def _result(steps: int, rounds: int) -> dict:
    entry = {
        "samples_per_s": 1000.0,
        "eval_auc": 0.8,
        "wall_s": 1.0,
        "cpu_s": 2.0,
        "quorum_wait_ms_per_step": 0.1,
        "vote_wait_ms_per_step": 0.2,
        "echo_wait_ms_per_step": 0.3,
        "quorums": 4,
    }
    std = {"samples_per_s": 1000.0, "eval_auc": 0.8, "wall_s": 1.0, "cpu_s": 2.0}
    return {
        "clean": {"ft": [entry] * rounds, "std": [std] * rounds},
        "pipeline": "sparse_dist",
        "mc": "none",
        "machine": "2 cores",
        "steps": steps,
        "rounds": rounds,
    }


def test_a_re_render_keeps_the_measured_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = argparse.Namespace(
        out=tmp_path, no_results_md=False, machine="2 cores", steps=300, rounds=2
    )
    measured = {**bench_environment(), "git_commit": "ab" * 20}
    res = _result(steps=1000, rounds=3)
    args.steps, args.rounds = res["steps"], res["rounds"]
    publish(args, res, clean_markdown(res, args), "ft_pipeline.json", "ft-pipeline", measured)
    assert stored_stamp("ft-pipeline", tmp_path)["git_commit"] == "ab" * 20
    argv = [
        "ft_bench.py",
        "--clean-only",
        "--pipeline",
        "sparse_dist",
        "--render-only",
        "--out",
        str(tmp_path),
    ]
    monkeypatch.setattr(sys, "argv", argv)  # the command line names neither steps nor rounds
    ft_bench.main()
    text = (tmp_path / "RESULTS.md").read_text()
    assert "(git abababab" in text and "1000 steps" in text and "--rounds 3" in text
    assert "0.1 / 0.2 / 0.3" in text  # the waits, by round


def test_overrides_are_named_in_the_text_and_the_regenerate_line() -> None:
    args = argparse.Namespace(machine="2 cores", steps=500, rounds=2)
    res = {**_result(steps=500, rounds=2), "set": ["data.batch_size_per_rank=512"]}
    text = clean_markdown(res, args)
    assert "with `data.batch_size_per_rank=512`" in text
    assert "--set 'data.batch_size_per_rank=512'" in text
    title = text.splitlines()[0]  # another section than the run without overrides
    assert title.endswith(", `data.batch_size_per_rank=512` (bench/ft_bench.py --clean-only)")
    assert title != clean_markdown(_result(steps=500, rounds=2), args).splitlines()[0]


def test_t_values_cover_pooled_runs_and_stay_decreasing() -> None:
    """Two 8-round runs pooled (15 df) get an interval; the table is Student's t."""
    assert T_975[14] == 2.131 and len(T_975) == 30
    assert all(a > b for a, b in zip(T_975, T_975[1:]))
    assert "(t, 15 df)" in _interval_text([0.9 + 0.01 * (i % 3) for i in range(16)])


def test_send_buffer_section_reports_the_means_and_their_ratio() -> None:
    import tests.bench_path  # noqa: F401  (ft_sync_bytes imports bench_util as a sibling)
    from bench import ft_sync_bytes

    runs = {
        "arena": [
            {"cpu_ms": 40.0, "wall_ms": 100.0, "placed": 29},
            {"cpu_ms": 60.0, "wall_ms": 120.0, "placed": 29},
        ],
        "fresh": [
            {"cpu_ms": 100.0, "wall_ms": 200.0, "placed": 0},
            {"cpu_ms": 100.0, "wall_ms": 240.0, "placed": 0},
        ],
    }
    args = argparse.Namespace(rows=1000, steps=30, rounds=2, machine="2 cores")
    text = ft_sync_bytes._send_buffer_markdown(runs, args)
    assert "CPU 50.00 vs 100.00 ms (**0.500x**)" in text
    assert "wall 110.00 vs 220.00 ms (**0.500x**)" in text
    assert "| 1 | 60.00 | 100.00 | 120.00 | 240.00 |" in text
    assert "at least 29 of 30 steps" in text and "0.1 MB" in text  # (1000*16 + 1000) * 4 bytes
    assert ft_sync_bytes._median([3.0, 1.0, 2.0]) == 2.0


def test_the_overlapped_quorum_section_renders_its_stored_run() -> None:
    """The run that retired ``overlap_quorum``: ratios from the stored samples/s, and the
    section the retired option's refusal names is the one this renders."""
    import json

    from bench.ft_report import overlap_quorum_markdown
    from sparse2d.ft.ft_options import RETIRED

    res = json.loads((ft_bench.RESULTS_DIR / "ft_overlap_quorum.json").read_text())
    text = overlap_quorum_markdown(res)
    ft, blocking = res["clean"]["ft"], res["clean"]["ft_blocking"]
    ratio = statistics.fmean(r["samples_per_s"] for r in ft) / statistics.fmean(
        r["samples_per_s"] for r in blocking
    )
    assert f"ratio of the mean samples/s: {ratio:.3f}" in text
    first = ft[0]["samples_per_s"] / blocking[0]["samples_per_s"]
    assert (
        f"| 0 | {ft[0]['samples_per_s']:.0f} | {blocking[0]['samples_per_s']:.0f} | {first:.3f} |"
        in text
    )
    assert "section ft-overlap-quorum" in RETIRED["overlap_quorum"]
    assert "<!-- ft-overlap-quorum:begin -->" in (ft_bench.HERE / "RESULTS.md").read_text()
