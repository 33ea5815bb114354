"""The environment stamp: versions as installed, git commit, and where it is written."""

from __future__ import annotations

import importlib.metadata as metadata
import json
import subprocess

import torch

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
from bench_util import write_section

from sparse2d.environment import PACKAGE_DIR, environment, git_commit, one_line
from tests.conftest import ROOT


def _fbgemm_version() -> str:
    for dist in ("fbgemm-gpu-cpu", "fbgemm-gpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    raise AssertionError("no fbgemm-gpu(-cpu) installed")


def _stamped(stamp: dict) -> dict[str, str]:
    """The stamp's versions without the local build label: ``torch.__version__`` says
    ``2.14.1+cu130`` where the PyPI wheel's metadata says ``2.14.1`` (the 1.9 set)."""
    return {k: stamp[k].split("+")[0] for k in _installed()}


def _installed() -> dict[str, str]:
    versions = {
        "sparse2d": metadata.version("sparse2d"),
        "torch": metadata.version("torch"),
        "torchrec": metadata.version("torchrec"),
        "fbgemm_gpu": _fbgemm_version(),
    }
    return {k: v.split("+")[0] for k, v in versions.items()}


def _git(*args: str) -> str | None:
    """git's answer in the repository root; None when the tests run outside a checkout."""
    out = subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False
    )
    return out.stdout.strip() if out.returncode == 0 else None


def test_stamp_matches_installed_versions_and_checkout() -> None:
    stamp = environment(backend="gloo", device_type="cpu", world_size=4, hosts=1)
    assert _stamped(stamp) == _installed()
    assert stamp["torch"] == torch.__version__  # the build label stays in the stamp
    assert stamp["git_commit"] == _git("rev-parse", "HEAD")
    if stamp["git_commit"] is not None:
        assert stamp["git_dirty"] is bool(_git("status", "--porcelain", "--untracked-files=no"))
    assert (stamp["backend"], stamp["device_type"], stamp["world_size"], stamp["hosts"]) == (
        "gloo",
        "cpu",
        4,
        1,
    )
    line = one_line(stamp)
    assert line.startswith(f"sparse2d {stamp['sparse2d']}")
    if stamp["git_commit"] is not None:
        assert f"(git {stamp['git_commit'][:10]}" in line
    assert f"torch {stamp['torch']}" in line and "world size 4" in line


def test_no_commit_outside_a_checkout(tmp_path) -> None:
    assert git_commit(str(tmp_path / "sparse2d" / "environment.py")) == (None, None)
    # a copy inside some other repository does not borrow that repository's commit
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "site" / "sparse2d").mkdir(parents=True)
    assert git_commit(str(tmp_path / "site" / "sparse2d" / "environment.py")) == (None, None)
    assert git_commit(PACKAGE_DIR)[0] == _git("rev-parse", "HEAD")


def test_trainer_stamps_start_record_and_summary(tiny_runs) -> None:
    run = tiny_runs["2d"]
    summary = json.loads((run / "summary.json").read_text())
    start = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert start["kind"] == "start"
    assert summary["environment"] == start["environment"]
    stamp = summary["environment"]
    assert _stamped(stamp) == _installed()
    assert stamp["git_commit"] == _git("rev-parse", "HEAD")
    assert (stamp["backend"], stamp["device_type"], stamp["world_size"], stamp["hosts"]) == (
        "gloo",
        "cpu",
        2,
        1,
    )


def test_bench_sections_carry_the_stamp(tmp_path) -> None:
    results = tmp_path / "RESULTS.md"
    write_section("| a | b |\n|---|---|\n| 1 | 2 |", "demo", results)
    write_section("| a | b |\n|---|---|\n| 3 | 4 |", "demo", results)  # re-run replaces it
    text = results.read_text()
    assert text.count("<!-- demo:begin -->") == 1 and "| 3 | 4 |" in text
    stamp = json.loads((tmp_path / "environment.json").read_text())["demo"]
    assert _stamped(stamp) == _installed()
    assert stamp["backend"] == "gloo" and stamp["git_commit"] == _git("rev-parse", "HEAD")
    # The section's line names the commit only ("uncommitted changes" would go stale once the
    # tree is committed); environment.json keeps git_dirty, whatever the checkout's state.
    assert isinstance(stamp["git_dirty"], bool)
    assert f"_Environment: {one_line({**stamp, 'git_dirty': False})}._" in text
    assert "uncommitted changes" not in text
