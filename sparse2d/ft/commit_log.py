"""Every committed step of a group, across its restarts and relaunches, in one append-only file.

A chaos run's invariant checker (``bench/chaos_check.py``) needs, per committed step, what
the group committed: two quorums that committed the same step with different weights (split
brain) or a group that committed a step twice (a redo) leave no other trace. ``CommitLog``
appends one JSON line per commit (``step``, ``quorum_id``, ``participants``, ``digest`` of the
writing rank's state after the commit, ``pid``, ``time``), each with a single ``write`` on an
``O_APPEND`` descriptor (a SIGKILL never leaves half a line between two whole ones). The file
spans the job: the trainer starts it again only for a file older than the job's launch
(``SPARSE2D_FT_LAUNCH_TIME``: another job's), so a host's relaunch appends (``stale``).
"""

from __future__ import annotations

import os
from typing import Any

from sparse2d.ft.heal_log import JsonLines, read_lines

FILENAME = "commits.jsonl"


class CommitLog(JsonLines):
    """``DIR/commits.jsonl`` of one group (written by one rank of the group); ``fresh``: the
    file belongs to another job and starts again."""

    def __init__(self, directory: str, fresh: bool) -> None:
        super().__init__(directory, FILENAME, fresh)


def stale(directory: str, launched: float | None, restart: int) -> bool:
    """Whether ``DIR/commits.jsonl`` belongs to an earlier job: older than this job's launch
    time when the launcher gave one, else any file at a fresh launch (torchrun restart 0)."""
    path = os.path.join(directory, FILENAME)
    if launched is None:
        return restart == 0
    return not os.path.exists(path) or os.path.getmtime(path) < launched


def read(directory: str) -> list[dict[str, Any]]:
    """Every commit in ``DIR/commits.jsonl``, oldest first (an unfinished line is skipped)."""
    return read_lines(os.path.join(directory, FILENAME))
