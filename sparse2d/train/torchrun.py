"""torchrun for the launchers, whose workers can end the job on an error a restart cannot cure.

``python -m sparse2d.train.torchrun ARGS`` is ``python -m torch.distributed.run ARGS`` plus
one thing: torchrun restarts the worker group after any failure, so a bad setting found on a
rank (a ``ConfigError``) failed ``--max-restarts`` more times and ended in ~70 lines of
``ChildFailedError``. This agent tells its workers (``SPARSE2D_NO_RESTART``) where to write a
final failure; the reporting rank writes its line there and sends the agent SIGTERM (stop
without restart); the agent exits 1 with that line as the launch's whole output.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile
import time

from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.run import main as torchrun_main

NO_RESTART = "SPARSE2D_NO_RESTART"
"""``<agent pid>:<file>``: where a worker of this agent records a failure not to restart."""

WAIT_FOR_AGENT_S = 30.0
"""How long the rank that stopped the job waits for the agent to end it (a bound only)."""


def final_failure(line: str) -> bool:
    """Record ``line`` as this launch's final failure and stop the agent (no restart).

    Called by the rank that reported a ``ConfigError``; True if this agent runs the worker
    (the worker then waits here to be ended), False under a plain torchrun or none."""
    agent, _, path = os.environ.get(NO_RESTART, "").partition(":")
    if not agent.isdigit() or int(agent) != os.getppid():
        return False  # not this agent's worker (a plain torchrun, or a child of a worker)
    try:  # the first rank to fail finally signals; the others only wait to be ended
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        fd = None
    except OSError:
        return False
    if fd is not None:
        os.write(fd, line.encode("utf-8", "replace"))
        os.close(fd)
        os.kill(int(agent), signal.SIGTERM)
    time.sleep(WAIT_FOR_AGENT_S)  # the agent ends this worker with the others
    return True


class _QuietAfterFinal(logging.Filter):
    """Drops torchrun's own records once a worker has recorded a final failure: the agent's
    'death signal' and 'closing signal' lines would bury the rank's one line."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name.startswith("torch.distributed") and os.path.exists(self.path))


def _torch_handlers() -> set[logging.Handler]:
    """The handlers torch's log records reach: torch gives several loggers their own."""
    loggers = [logging.getLogger()] + [
        logger
        for name, logger in logging.root.manager.loggerDict.items()
        if name.startswith("torch") and isinstance(logger, logging.Logger)
    ]
    return {handler for logger in loggers for handler in logger.handlers}


def main(argv: list[str] | None = None) -> int:
    """torchrun's ``main`` on ``argv``; 1 without torchrun's report when a worker ended the
    job with a final failure (its line already written)."""
    private = tempfile.mkdtemp(prefix="sparse2d-torchrun-")
    path = os.path.join(private, "final_failure")
    os.environ[NO_RESTART] = f"{os.getpid()}:{path}"
    quiet = _QuietAfterFinal(path)
    for handler in _torch_handlers():
        handler.addFilter(quiet)
    try:
        torchrun_main(sys.argv[1:] if argv is None else argv)
    except SignalException:
        if not os.path.exists(path):
            raise  # a signal from outside (Ctrl-C, a scheduler): torchrun's own report
        return 1
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
