"""Run docs snippets, each in its own forked child of one interpreter that imported torch once.

A snippet is what a reader pastes into a fresh Python process. Starting one costs ~4.5
CPU-seconds of imports (torch, TorchRec, FBGEMM) before its first line; with a dozen
snippets that was ~40 s of a 2-core suite. This runner imports them once and forks a child
per snippet: each child is still its own process (own memory, own process group, own exit
code), with ``__name__ == "__main__"``, started from the repository root with the
environment the test gives the runner.

Protocol: one JSON object per stdin line ``{"code": ..., "log": path}``; the child's stdout
and stderr go to ``log``; the runner answers one JSON line ``{"returncode": N}``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def _run_child(code: str, log: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    status = 0
    try:
        exec(compile(code, "<snippet>", "exec"), {"__name__": "__main__"})  # noqa: S102
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # the reader would see this traceback
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # no atexit/threads teardown of the parent's copy


def main() -> None:
    import torch  # noqa: F401  (the imports every snippet pays for, paid once)
    import torchrec  # noqa: F401

    import sparse2d.core.collection  # noqa: F401

    answer = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        answer.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _run_child(request["code"], request["log"])
        _, status = os.waitpid(pid, 0)
        answer.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
        answer.flush()


if __name__ == "__main__":
    main()
