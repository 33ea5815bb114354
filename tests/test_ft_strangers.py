"""Strangers at the ports (issue 64): while a fault-tolerant job trains (``launch/ft_local.sh``,
2 groups x 1 rank), random bytes, half-open connections and a second job's ranks reach its
lighthouse and its rendezvous stores. The job keeps training, and nothing of the stranger is
admitted.

The ports: the lighthouse (torchft's, HTTP/1 and gRPC on one port), group 0's torchrun agent
store (the rendezvous store its workers share, ``MASTER_PORT`` in their environment) and the
round store its rank 0 binds (``sparse2d.train.rendezvous``: its port is the agent store's
round key). What each stranger did is printed (``pytest -s``) for docs/fault_tolerance.md.
"""

from __future__ import annotations

import datetime
import json
import os
import random
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from bench.ft_workers import workers
from tests.test_ft_launch import launch, summary, train_records

STEPS = 4000
"""About 4.4 ms a step on a quiet box (18 s): the job must outlast every stranger (the second
run's torchrun, two Python starts with torch, is the slowest); with 1200 steps the foreign
quorum landed at step 1180 of a passing run."""
STRANGER_JOB = "stranger"
STRANGER_ID = f"sparse2d_job_{STRANGER_JOB}_group_0"
NOISE = random.Random(64).randbytes(4096)
HALF = {
    "lighthouse": b"POST /torchft.LighthouseService/Quorum HTTP/1.1\r\nHost: x\r\nContent-Le",
    "store": b"\x00\x07\x00",  # a query type, then a few bytes of a key's length
}
SECOND_RUN = textwrap.dedent(
    """
    import datetime, json, os, sys
    import torch, torch.distributed as dist
    from sparse2d.train.rendezvous import round_key, round_store
    store = round_store(0, datetime.timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    with open(sys.argv[1], "w") as f:
        json.dump({"key": round_key(), "port": store.port, "world": dist.get_world_size()}, f)
    dist.destroy_process_group()
    """
)
"""A second torchrun run's only rank: it rendezvouses on the job's agent store (another
rendezvous id) and publishes its round store there, as the trainer's rank 0 does."""


class Steps:
    """The job's ``[train] replica=g step=N`` lines, read as they come."""

    def __init__(self, out) -> None:
        self.lines: list[str] = []
        self.last: dict[int, int] = {}
        self._thread = threading.Thread(target=self._read, args=(out,), daemon=True)
        self._thread.start()

    def _read(self, out) -> None:
        for line in out:
            self.lines.append(line)
            if line.startswith("[train] replica="):
                group = int(line.split("replica=")[1].split()[0])
                self.last[group] = int(line.split(" step=")[1].split()[0])

    def advanced(self, past: dict[int, int], what: str, limit_s: float = 120) -> dict[int, int]:
        """Wait until every group logged a step after ``past`` (no hang): the steps seen."""
        deadline = time.monotonic() + limit_s
        while not all(self.last.get(g, -1) > s for g, s in past.items()):
            assert time.monotonic() < deadline, (what, past, "".join(self.lines[-20:]))
            time.sleep(0.1)
        return dict(self.last)


def _noise(port: int) -> str:
    """Send ``NOISE`` to ``port``; what the server did with the connection, and when."""
    start = time.monotonic()
    with socket.create_connection(("localhost", port), timeout=1) as s:
        try:
            s.sendall(NOISE)
            while s.recv(65536):  # an error page is fine; the connection must end
                pass
            how = "closed"
        except ConnectionResetError:
            how = "reset"
        except TimeoutError:
            how = "still open after 1 s"
    return f"{how} after {1000 * (time.monotonic() - start):.0f} ms"


def _store(port: int):
    from torch.distributed import TCPStore

    return TCPStore(
        "localhost",
        port,
        is_master=False,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=10),
    )


def _still_serves(lighthouse: str, agent_port: int, key: str) -> str:
    """The lighthouse still answers its status page with this job only; the agent store
    still answers a read: the round store's port."""
    from sparse2d.ft.lighthouse import check_job

    check_job(lighthouse, JOB[0], timeout_s=10)
    return _store(agent_port).get(key).decode()


JOB: list[str] = []


def test_strangers_at_the_ports_are_refused_and_the_job_trains_on(tmp_path: Path) -> None:
    run_dir = tmp_path / "job"
    job = launch(
        run_dir, 2, f"train.steps={STEPS}", "train.log_every=5", "train.eval_batches=8", nproc=1
    )
    said: dict[str, str] = {}
    stranger_run = None
    held: list[socket.socket] = []
    try:
        steps = Steps(job.stdout)
        seen = steps.advanced({0: 19, 1: 19}, "the job's first 20 steps", limit_s=240)
        pid = workers(0, run_dir)[0]
        env = dict(
            kv.split("=", 1)
            for kv in Path(f"/proc/{pid}/environ").read_text(errors="replace").split("\0")
            if "=" in kv
        )
        JOB[:] = [env["SPARSE2D_FT_JOB"]]
        lighthouse = env["TORCHFT_LIGHTHOUSE"]
        agent_port = int(env["MASTER_PORT"])
        key = f"sparse2d/{env['TORCHELASTIC_RUN_ID']}/round_0/store_port"
        round_port = int(_store(agent_port).get(key))
        ports = {
            "lighthouse": int(lighthouse.rsplit(":", 1)[1]),
            "agent store": agent_port,
            "round store": round_port,
        }
        # (c2) started first: a second run's torchrun takes a few seconds to start
        script = tmp_path / "second_run.py"
        script.write_text(SECOND_RUN)
        stranger_run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "1",
                "--nproc-per-node",
                "1",
                "--max-restarts",
                "0",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{agent_port}",
                "--rdzv-id",
                "stranger-run",
                "--rdzv-conf",
                "is_host=false",
                str(script),
                str(tmp_path / "second_run.json"),
            ],
            env=dict(
                os.environ,
                OMP_NUM_THREADS="1",
                PYTHONPATH=str(Path(__file__).parent.parent),
                TORCH_DISABLE_SHARE_RDZV_TCP_STORE="0",  # its rank uses the job's store
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        # (a) random bytes at every port
        said["ports"] = str(ports)
        for name, port in ports.items():
            said[f"random bytes -> {name}"] = _noise(port)
        assert _still_serves(lighthouse, agent_port, key) == str(round_port)
        seen = steps.advanced(seen, "random bytes")
        # (b) half-open: connect, a partial header, never finish (held to the end)
        for name, port in ports.items():
            s = socket.create_connection(("localhost", port), timeout=10)
            s.sendall(HALF["lighthouse" if name == "lighthouse" else "store"])
            held.append(s)
        assert _still_serves(lighthouse, agent_port, key) == str(round_port)
        seen = steps.advanced(seen, "half-open connections")
        # (c1) another job's group asks the lighthouse for a quorum, claiming a later step
        # (a group behind would heal from it; one ahead would send it the job's state)
        from torchft._torchft import LighthouseClient

        start = time.monotonic()
        quorum = LighthouseClient(lighthouse, datetime.timedelta(seconds=10)).quorum(
            replica_id=STRANGER_ID,
            timeout=datetime.timedelta(seconds=30),
            address="http://127.0.0.1:9",
            store_address="127.0.0.1:9",
            step=10**6,
            world_size=1,
            shrink_only=False,
        )
        joined = sorted(p.replica_id.split(":")[0] for p in quorum.participants)
        said["foreign quorum request -> lighthouse"] = (
            f"answered after {1000 * (time.monotonic() - start):.0f} ms with a quorum of {joined}"
        )
        seen = steps.advanced(seen, "a foreign group's quorum request")
        # (c2) the second run ends: it rendezvoused on the job's store, alone
        out, _ = stranger_run.communicate(timeout=180)
        assert stranger_run.returncode == 0, out[-3000:]
        second = json.loads((tmp_path / "second_run.json").read_text())
        said["second run -> agent store"] = f"rendezvoused alone there: {second}"
        assert _still_serves(lighthouse, agent_port, key) == str(round_port), second
        steps.advanced(seen, "a second run at the store")
        job.wait(timeout=300)
    finally:
        for s in held:
            s.close()
        for proc in (job, stranger_run):
            if proc is not None and proc.poll() is None:
                proc.terminate()  # the launcher's trap stops its lighthouse and torchruns
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
    for what, result in said.items():
        print(f"{what}: {result}")
    assert job.returncode == 0, "".join(steps.lines[-40:])
    # the stranger reached the job's quorum at the lighthouse (the test's reach) ...
    mine = [f"sparse2d_job_{JOB[0]}_group_{g}" for g in (0, 1)]
    assert STRANGER_ID in joined and set(joined) - {STRANGER_ID} <= set(mine), joined
    assert len(joined) >= 2, joined
    for g in (0, 1):
        # ... and each group in that quorum refused it; none ever committed a step with it
        # or healed from it
        log = (run_dir / f"replica_{g}.log").read_text()
        refused = f"foreign replica ids ['{STRANGER_ID}']" in log
        assert refused or mine[g] not in joined, log[-3000:]
        s = summary(run_dir, g)
        assert s["final_step"] == STEPS and s["restart_count"] == 0, s
        assert [h for h in s["heals"] if h["step"] > 0] == [], s["heals"]
        assert max(r["participants"] for r in train_records(run_dir, g)) == 2
    assert second["world"] == 1 and second["key"] != key, second
