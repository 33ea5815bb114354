"""``sparse2d report RUN_DIR [RUN_DIR ...] [-o out.png]``: compare runs without a script.

Draws loss, AUC and samples/s over steps for every run on one figure and prints one table of
the runs' shape, quality, throughput, sync cost and environment stamp. A resumed run appends
to ``metrics.jsonl``; the latest value logged for a step wins.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from sparse2d.errors import ConfigError, NotARunError


@dataclass
class Run:
    """One run directory's records: ``series[kind][key] = {step: value}``."""

    path: str
    label: str
    start: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] | None = None
    series: dict[str, dict[str, dict[int, float]]] = field(default_factory=dict)

    def curve(self, kind: str, key: str) -> tuple[list[int], list[float]]:
        points = sorted(self.series.get(kind, {}).get(key, {}).items())
        return [s for s, _ in points], [v for _, v in points]

    def last(self, kind: str, key: str) -> float | None:
        steps, values = self.curve(kind, key)
        return values[-1] if values else None


def load_run(path: str) -> Run:
    """Read a run directory; ``NotARunError`` names what is missing."""
    metrics = os.path.join(path, "metrics.jsonl")
    if not os.path.isdir(path):
        raise NotARunError(
            f"{path!r} is not a directory (give a trainer RUN_DIR, e.g. runs/tiny_cpu)."
        )
    if not os.path.isfile(metrics):
        raise NotARunError(
            f"{path!r} is not a sparse2d run: it has no metrics.jsonl (a RUN_DIR written by "
            "`python -m sparse2d.train` holds metrics.jsonl, summary.json and config.yaml)."
        )
    run = Run(path=path, label=os.path.basename(os.path.normpath(path)) or path)
    with open(metrics) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if f.read(1) == "":  # the last line of a run still writing (or killed)
                    break
                raise NotARunError(f"{metrics}:{number}: not a JSON record.") from None
            kind = record.get("kind")
            if kind == "start":
                run.start = record
            elif "step" in record:
                table = run.series.setdefault(kind, {})
                for key, value in record.items():
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        table.setdefault(key, {})[int(record["step"])] = float(value)
    if not run.start and not run.series:
        raise NotARunError(f"{metrics}: no records yet (has the run started?).")
    summary = os.path.join(path, "summary.json")
    if os.path.isfile(summary):
        with open(summary) as f:
            run.summary = json.load(f)
    return run


def _labels(runs: list[Run]) -> None:
    """Name runs by their directory plus shape, e.g. ``tiny_cpu (L=2 of 4)``."""
    names = [r.label for r in runs]
    for run in runs:
        if names.count(run.label) > 1:  # same basename in different parents
            run.label = run.path
        info = run.summary or run.start
        if "sharding_group_size" in info and "world_size" in info:
            run.label += f" (L={info['sharding_group_size']} of {info['world_size']})"


COLUMNS = (
    ("run", None),
    ("steps", "steps"),
    ("world", "world_size"),
    ("L", "sharding_group_size"),
    ("replicas", "num_replicas"),
    ("sync every", "sync_every"),
    ("train loss", "train_loss"),
    ("eval loss", "eval_loss"),
    ("eval AUC", "eval_auc"),
    ("planted AUC", "planted_auc"),
    ("eval NE", "eval_ne"),
    ("samples/s", "samples_per_s"),
    ("sync s/step", "sync_s_per_step"),
    ("code", None),
)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 1e4:
            return f"{value:.0f}"
        return f"{value:.4g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.2e}"
    return str(value)


def table(runs: list[Run]) -> str:
    """One Markdown table: a row per run (an unfinished run: its latest logged values)."""
    rows = []
    for run in runs:
        info = dict(run.start)
        fallback = {
            "steps": run.last("train", "step"),
            "train_loss": run.last("train", "train_loss"),
            "eval_loss": run.last("eval", "eval_loss"),
            "eval_auc": run.last("eval", "eval_auc"),
            "planted_auc": run.last("eval", "planted_auc"),
            "eval_ne": run.last("eval", "eval_ne"),
            "samples_per_s": run.last("train", "samples_per_s"),
            "sync_s_per_step": run.last("train", "sync_s_per_step"),
        }
        info.update({k: v for k, v in fallback.items() if v is not None})
        info.update(run.summary or {})
        if isinstance(info.get("steps"), float):
            info["steps"] = int(info["steps"])
        env = info.get("environment") or {}
        code = _cell(env.get("git_commit", "")[:10] if env.get("git_commit") else None)
        if env.get("git_dirty"):
            code += "+changes"
        if env:
            code += f" torch {env.get('torch')} torchrec {env.get('torchrec')}"
        if run.summary is None:
            code += " (unfinished)"
        row = [run.label] + [_cell(info.get(key)) for _, key in COLUMNS[1:-1]] + [code]
        rows.append(row)
    head = [name for name, _ in COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


PANELS = (
    ("loss", (("train", "train_loss", "-"), ("eval", "eval_loss", "--"))),
    ("AUC", (("train", "train_auc", "-"), ("eval", "eval_auc", "--"))),
    ("samples/s", (("train", "samples_per_s", "-"),)),
)


def figure(runs: list[Run]) -> Any:
    """Loss, AUC and samples/s over steps, one colour per run (a matplotlib figure)."""
    try:  # the optional dependency (``sparse2d[train]``), needed only for ``-o``
        import matplotlib
    except ImportError:
        raise ConfigError(
            "sparse2d report -o needs matplotlib: pip install 'sparse2d[train]' (or matplotlib)."
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 4), squeeze=False)
    for ax, (title, lines) in zip(axes[0], PANELS):
        for i, run in enumerate(runs):
            for kind, key, style in lines:
                steps, values = run.curve(kind, key)
                if steps:
                    marker = "o" if len(steps) <= 12 else None
                    ax.plot(
                        steps,
                        values,
                        style,
                        color=f"C{i}",
                        marker=marker,
                        markersize=3,
                        label=f"{run.label} {kind}",
                    )
        ax.set_title(title + (" (train solid, eval dashed)" if len(lines) > 1 else ""), fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for i, run in enumerate(runs):  # the best AUC the synthetic data allows (its planted model)
        planted = (run.summary or {}).get("planted_auc") or run.last("eval", "planted_auc")
        if planted is not None:
            axes[0][1].axhline(
                planted, color=f"C{i}", linestyle=":", linewidth=1, label=f"{run.label} planted"
            )
    axes[0][1].legend(fontsize=7)
    axes[0][2].set_ylim(bottom=0)  # throughput compares by height, not by a cropped range
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot(runs: list[Run], out: str) -> None:
    """``figure(runs)`` into ``out`` (PNG, SVG, ...)."""
    fig = figure(runs)  # first: it names a missing matplotlib in one line
    import matplotlib.pyplot as plt

    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sparse2d report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="trainer run directories")
    parser.add_argument("-o", "--out", help="write the figure here (e.g. report.png)")
    args = parser.parse_args(argv)
    try:
        runs = [load_run(path) for path in args.runs]
        _labels(runs)
        print(table(runs))
        if args.out:
            plot(runs, args.out)
            print(f"figure: {args.out}")
    except ConfigError as error:
        print(f"sparse2d report: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
