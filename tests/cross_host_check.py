"""2D against TorchRec's 1D DMP across emulated hosts: the worker every rank runs.

Launched by ``tests/test_emulated_hosts.py`` through ``launch/emulated_hosts.sh`` with
``ENTRY=tests.cross_host_check`` (one torchrun per emulated host, gloo over each host's own
shaped link). Each rank runs ``tests.test_core_collection.check_2d_equals_1d``, the same check the
single-host suite runs (EXACT_SGD, a sync after every step, 1e-5 against TorchRec's own 1D
``DistributedModelParallel``, bit-identical replicas after each sync), for both replica
layouts; rank 0 writes what it saw to ``argv[1]`` (which host each rank ran on, the checks'
results), or the error.
"""

from __future__ import annotations

import datetime
import json
import socket
import sys
import traceback

import torch
import torch.distributed as dist


def main(out: str) -> int:
    from sparse2d.known_warnings import ignore_known_warnings

    ignore_known_warnings()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    hosts: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    report: dict = {"hosts": hosts}
    try:
        from tests.test_core_collection import STEPS, check_2d_equals_1d

        for layout in ("intra_host", "inter_host"):
            result = check_2d_equals_1d(2, "pooled", layout)
            if result["replica_diffs"] != [0.0] * STEPS:
                raise AssertionError(f"{layout}: replicas differ {result['replica_diffs']}")
            report[layout] = result
        report["ok"] = True
    except Exception as error:  # every rank raises alike (collectives); rank 0 reports it
        report.update(ok=False, error=f"{error}\n{traceback.format_exc()}")
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(report, f)
    dist.destroy_process_group()
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
