"""``sparse2d report`` on real tiny runs: the table, the figure, and directories that are not runs."""

from __future__ import annotations

import json
import shutil

import matplotlib.image

from sparse2d.train.cli import main as cli
from sparse2d.train.report import figure, load_run, table


def test_two_runs_table_and_png(tiny_runs, tmp_path, capsys) -> None:
    out = tmp_path / "cmp.png"
    assert cli(["report", str(tiny_runs["2d"]), str(tiny_runs["1d"]), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    rows = [line for line in text.splitlines() if line.startswith("| tiny_")]
    assert len(rows) == 2, text
    assert rows[0].startswith("| tiny_2d (L=1 of 2) | 6 | 2 | 1 | 2 | 1 |")
    assert rows[1].startswith("| tiny_1d (L=2 of 2) | 6 | 2 | 2 | 1 | 1 |")
    summary = json.loads((tiny_runs["2d"] / "summary.json").read_text())
    assert f"| {summary['eval_auc']:.4g} |" in rows[0]
    assert summary["environment"]["git_commit"] is None or (
        summary["environment"]["git_commit"][:10] in rows[0]
    )
    image = matplotlib.image.imread(str(out))
    assert image.shape[0] > 300 and image.shape[1] > 1000
    assert image[..., :3].std() > 0.05  # curves drawn, not a blank canvas


def test_throughput_starts_at_zero_and_the_planted_auc_is_drawn(tiny_runs) -> None:
    """The samples/s axis starts at zero (runs compare by height), and each run's planted
    AUC (the synthetic data's own model, the best AUC its labels allow) is a dotted line on
    the AUC panel and a table column."""
    import matplotlib.pyplot as plt

    runs = [load_run(str(tiny_runs["2d"]))]
    planted = json.loads((tiny_runs["2d"] / "summary.json").read_text())["planted_auc"]
    fig = figure(runs)
    try:
        loss, auc, throughput = fig.axes
        assert throughput.get_ylim()[0] == 0
        lines = [x for x in auc.get_lines() if x.get_label().endswith(" planted")]
        assert len(lines) == 1 and list(lines[0].get_ydata()) == [planted, planted]
    finally:
        plt.close(fig)
    header, _, row = table(runs).splitlines()
    column = header.split(" | ").index("planted AUC")
    assert row.split(" | ")[column] == f"{planted:.4g}", (header, row)


def test_curves_come_from_every_logged_step(tiny_runs) -> None:
    run = load_run(str(tiny_runs["2d"]))
    assert run.curve("train", "train_loss")[0] == [2, 4, 6]
    assert run.curve("eval", "eval_auc")[0] == [3, 6]
    assert run.curve("train", "samples_per_s")[1][0] > 0


def test_unfinished_and_resumed_runs(tiny_runs, tmp_path) -> None:
    """A run still writing: no summary.json, a half-written last line; a resumed run
    appends records for steps it already logged: the latest value wins."""
    run_dir = tmp_path / "partial"
    shutil.copytree(tiny_runs["2d"], run_dir)
    (run_dir / "summary.json").unlink()
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    again = json.loads(next(line for line in lines if '"train"' in line))
    again["train_loss"] = 9.0
    text = "\n".join(lines) + "\n" + json.dumps(again) + "\n" + '{"kind": "train", "st'
    (run_dir / "metrics.jsonl").write_text(text)
    run = load_run(str(run_dir))
    assert run.summary is None
    assert dict(zip(*run.curve("train", "train_loss")))[again["step"]] == 9.0
    assert "(unfinished)" in table([run])


def test_not_a_run_is_one_clear_line(tmp_path, capsys) -> None:
    (tmp_path / "empty").mkdir()
    assert cli(["report", str(tmp_path / "empty")]) == 1
    err = capsys.readouterr().err
    assert "is not a sparse2d run: it has no metrics.jsonl" in err and "empty" in err
    assert cli(["report", str(tmp_path / "missing")]) == 1
    assert "is not a directory" in capsys.readouterr().err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "metrics.jsonl").write_text("not json\n{}\n")
    assert cli(["report", str(tmp_path / "bad")]) == 1
    assert "metrics.jsonl:1: not a JSON record" in capsys.readouterr().err
