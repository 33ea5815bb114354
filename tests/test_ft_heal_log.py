"""``sparse2d.ft.heal_log``: every heal of a group across its process restarts, in real files
written by real processes (a SIGKILLed writer included)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from sparse2d.ft.heal_log import HealLog
from tests.conftest import ROOT

WRITER = """
import sys
from sparse2d.ft.heal_log import HealLog
log = HealLog(sys.argv[1], fresh_launch=sys.argv[2] == "1")
for i in range(int(sys.argv[3])):
    log.append({"step": int(sys.argv[4]) + i, "from_group": 0, "from_step": 0, "bytes": 8})
print("ready", flush=True)
sys.stdin.read()  # wait to be killed
"""


def _restart(directory, fresh: bool, heals: int, first_step: int) -> None:
    """One process of the group: record ``heals`` heals, then be SIGKILLed (torchrun restarts)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            WRITER,
            str(directory),
            "1" if fresh else "0",
            str(heals),
            str(first_step),
        ],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=ROOT),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "ready\n"  # type: ignore[union-attr]
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def test_heals_of_every_restart_are_listed_and_a_new_launch_starts_over(tmp_path) -> None:
    _restart(tmp_path, fresh=True, heals=1, first_step=0)  # launch: the step-0 copy
    _restart(tmp_path, fresh=False, heals=1, first_step=130)  # killed, restarted, healed
    _restart(tmp_path, fresh=False, heals=2, first_step=400)  # and again (plus a later heal)
    assert [h["step"] for h in HealLog(str(tmp_path), fresh_launch=False).read()] == [
        0,
        130,
        400,
        401,
    ]
    relaunch = HealLog(str(tmp_path), fresh_launch=True)  # a new launch of the job
    assert relaunch.read() == []
    relaunch.append({"step": 7})
    assert relaunch.read() == [{"step": 7}]


def test_an_unfinished_last_line_is_skipped(tmp_path) -> None:
    log = HealLog(str(tmp_path), fresh_launch=True)
    log.append({"step": 3, "from_group": 1})
    with open(log.path, "a") as f:
        f.write('{"step": 9, "from_gr')  # a writer that never finished its line
    assert log.read() == [{"from_group": 1, "step": 3}]
    assert json.loads(open(log.path).readline()) == {"from_group": 1, "step": 3}
