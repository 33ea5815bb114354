"""bench/checkout_ab.py: the stored before/after runs render with their own means and ratio,
and a commit exports into a tree that imports its own sparse2d."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
import checkout_ab

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"
STORED = sorted(RESULTS.glob("checkout_ab_*.json"))


@pytest.mark.parametrize("path", STORED, ids=lambda p: p.stem)
def test_the_stored_run_renders_its_own_means_and_ratio(path: Path) -> None:
    result = json.loads(path.read_text())
    text = checkout_ab.render(result)
    mean = {
        n: statistics.mean(r["samples_per_s"] for r in runs) for n, runs in result["runs"].items()
    }
    assert f"| mean | {mean['before']:,.0f} | {mean['after']:,.0f} |" in text
    assert f"After / before: **{mean['after'] / mean['before']:.3f}**" in text
    assert f"--job {result['job']} --before {result['commits']['before'][:7]}" in text
    assert len(result["runs"]["before"]) == len(result["runs"]["after"]) >= 2


def test_a_commit_exports_into_a_tree_that_imports_its_own_sparse2d(tmp_path: Path) -> None:
    commit = checkout_ab.export("HEAD", tmp_path / "tree")
    assert len(commit) == 40 and (tmp_path / "tree" / "sparse2d" / "__init__.py").exists()
    found = subprocess.run(
        [sys.executable, "-c", "import sparse2d; print(sparse2d.__file__)"],
        cwd=tmp_path / "tree",
        env={"PYTHONPATH": str(tmp_path / "tree"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert found.startswith(str(tmp_path / "tree")), found
