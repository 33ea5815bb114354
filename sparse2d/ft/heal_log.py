"""Every heal of a group across its process restarts, in one append-only file.

``FaultTolerance.heals`` lists the heals of one process; torchrun restarts a group as new
processes, so a group killed twice would otherwise report only its last process's heals.
``HealLog`` appends each heal as one JSON line, written with a single ``write`` on an
``O_APPEND`` descriptor (a line is never split by a SIGKILL or interleaved with another
writer), and ``read`` returns them all. A fresh launch of the group (torchrun restart 0)
starts the file again, so the list is that launch's: restarts append to it.
"""

from __future__ import annotations

import json
import os
from typing import Any

FILENAME = "heals.jsonl"


class JsonLines:
    """One group's append-only file of JSON lines (``HealLog``, ``CommitLog``): each record
    one line written with a single ``write`` on an ``O_APPEND`` descriptor."""

    def __init__(self, directory: str, filename: str, fresh: bool) -> None:
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, filename)
        if fresh:  # an earlier launch's (or job's) records are not this one's
            with open(self.path, "w"):
                pass

    def append(self, record: dict[str, Any]) -> None:
        """Add one record (one line, one ``write``)."""
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def read(self) -> list[dict[str, Any]]:
        """Every record, oldest first (an unfinished line is skipped)."""
        return read_lines(self.path)


def read_lines(path: str) -> list[dict[str, Any]]:
    """Every JSON line of ``path``, oldest first; none if it does not exist; an unfinished
    line (a writer killed mid-``write``) is skipped."""
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


class HealLog(JsonLines):
    """``DIR/heals.jsonl`` of one group (write it from one rank of the group); a fresh launch
    of the group starts it again."""

    def __init__(self, directory: str, fresh_launch: bool) -> None:
        super().__init__(directory, FILENAME, fresh_launch)
