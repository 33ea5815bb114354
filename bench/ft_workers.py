"""The trainer workers of one fault-tolerant group, found by their command line: what a
kill run (``bench/ft_bench.py``) and the launch tests (``tests/test_ft_launch.py``) SIGKILL."""

from __future__ import annotations

import os


def workers(group: int, run_dir: object) -> dict[int, int]:
    """``{local rank: pid}`` of the trainer workers of ``group`` of the job writing to
    ``run_dir`` (not its torchrun agent). The run directory is part of the match: another
    job on the machine (a concurrent test run, a leftover worker) has a group ``group`` too,
    and killing its worker instead would leave this job's group alive."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(
                    kv.split("=", 1)
                    for kv in f.read().decode(errors="replace").split("\0")
                    if "=" in kv
                )
        except OSError:
            continue
        if (
            f"fault_tolerance.replica_id={group}" in argv
            and "sparse2d.train" in argv
            and f"run_dir={run_dir}" in argv
            and "torch.distributed.run" not in argv
            and "LOCAL_RANK" in env
        ):
            found[int(env["LOCAL_RANK"])] = int(entry)
    return found
