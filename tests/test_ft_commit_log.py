"""``sparse2d.ft.commit_log``: one whole JSON line per commit, a half-written line skipped, and
a file kept across a job's relaunches but started again for another job."""

from __future__ import annotations

import os
from pathlib import Path

from sparse2d.ft import commit_log
from sparse2d.ft.commit_log import CommitLog


def test_commits_read_back_in_order_and_a_torn_line_is_skipped(tmp_path: Path) -> None:
    log = CommitLog(str(tmp_path), fresh=True)
    for step in (1, 2):
        log.append({"step": step, "digest": "ab", "pid": 7})
    with open(log.path, "a") as f:
        f.write('{"step": 3, "dig')  # a SIGKILL in the middle of a write
    assert [r["step"] for r in commit_log.read(str(tmp_path))] == [1, 2]
    assert commit_log.read(str(tmp_path / "none")) == []


def test_a_relaunch_appends_and_a_fresh_job_starts_again(tmp_path: Path) -> None:
    CommitLog(str(tmp_path), fresh=True).append({"step": 1})
    written = os.path.getmtime(tmp_path / commit_log.FILENAME)
    # launched before the file was written: a relaunch of this job keeps it
    assert not commit_log.stale(str(tmp_path), written - 10, restart=0)
    CommitLog(str(tmp_path), fresh=False).append({"step": 2})
    assert [r["step"] for r in commit_log.read(str(tmp_path))] == [1, 2]
    # launched after it: an earlier job's file
    assert commit_log.stale(str(tmp_path), written + 10, restart=0)
    # no launch time: a fresh torchrun launch starts again, a restart appends
    assert commit_log.stale(str(tmp_path), None, restart=0)
    assert not commit_log.stale(str(tmp_path), None, restart=1)
    CommitLog(str(tmp_path), fresh=True)
    assert commit_log.read(str(tmp_path)) == []
