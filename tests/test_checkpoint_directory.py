"""``sparse2d.checkpoint.directory``: the directory's bookkeeping, on real files (no ranks)."""

from __future__ import annotations

import json
from pathlib import Path

from sparse2d.checkpoint.directory import LATEST, MARKER, latest, partial_saves, prune


def _complete(root: Path, step: int) -> None:
    (root / f"step_{step:08d}").mkdir()
    (root / f"step_{step:08d}" / MARKER).write_text(json.dumps({"step": step}))


def test_partial_saves_names_saves_cut_short_and_nothing_else(tmp_path: Path) -> None:
    """A save killed midway (``step_N.tmp-*``, with or without data) is named; complete
    checkpoints, one being replaced (``.trash-``) and a stale pointer file are not."""
    assert partial_saves(tmp_path / "missing") == []
    _complete(tmp_path, 40)
    (tmp_path / LATEST).write_text("step_00000040")
    (tmp_path / "step_00000080.tmp-1a2b3c4d").mkdir()
    (tmp_path / "step_00000080.tmp-1a2b3c4d" / "__0_0.distcp").write_bytes(b"half")
    (tmp_path / "step_00000120.tmp-00ff00ff").mkdir()
    (tmp_path / "step_00000040.trash-5e6f7a8b").mkdir()
    (tmp_path / "latest.tmp-9c0d1e2f").write_text("step_00000080")
    assert partial_saves(tmp_path) == ["step_00000080.tmp-1a2b3c4d", "step_00000120.tmp-00ff00ff"]
    assert latest(tmp_path) == str(tmp_path / "step_00000040")  # neither is ever loaded
    prune(tmp_path, 2)  # the next save's pruning removes them
    assert partial_saves(tmp_path) == []
