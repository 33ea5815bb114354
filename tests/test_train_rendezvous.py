"""sparse2d.train.rendezvous under a real torchrun restart: each round gets a fresh store
bound by its rank 0, found through the agent's (shared) store under that round's key.

The workers are a few lines of torch.distributed (no TorchRec): round 0 all-reduces, then
rank 1 fails; torchrun restarts both, and round 1 must connect and all-reduce again. With
the agent store used directly, round 1 would read round 0's gloo addresses (refused); with
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` rank 0 would bind a port chosen earlier by the
agent, which a busy host can take in between (EADDRINUSE, seen in the suite).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from sparse2d.train import rendezvous

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKER = textwrap.dedent(
    """
    import datetime, json, os, sys
    import torch, torch.distributed as dist
    from sparse2d.train.rendezvous import owns_round_store, round_store
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    agent_port = os.environ["MASTER_PORT"]
    owns = owns_round_store()
    store = round_store(rank, datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    x = torch.tensor([float(rank + 1 + 10 * attempt)])
    dist.all_reduce(x)
    with open(os.path.join(sys.argv[1], f"{attempt}_{rank}.json"), "w") as f:
        json.dump(dict(owns=owns, agent_port=agent_port, port=os.environ["MASTER_PORT"],
                       sum=x.item()), f)
    dist.barrier()
    if attempt == 0 and rank == 1:
        os._exit(3)  # a failed worker: torchrun restarts the round
    dist.destroy_process_group()
    """
)


def test_a_restart_round_gets_a_fresh_store_and_connects(tmp_path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)  # torchrun's default: shared
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        str(script),
        str(tmp_path),
    ]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    rounds = {}
    for attempt in (0, 1):
        got = [json.loads((tmp_path / f"{attempt}_{r}.json").read_text()) for r in (0, 1)]
        assert all(g["owns"] for g in got), got
        assert got[0]["port"] == got[1]["port"] != got[0]["agent_port"], got  # rank 0's own
        assert [g["sum"] for g in got] == [3.0 + 20 * attempt] * 2, got
        rounds[attempt] = got[0]
    assert rounds[0]["agent_port"] == rounds[1]["agent_port"], rounds  # one agent store
    assert rounds[0]["port"] != rounds[1]["port"], rounds  # a fresh store per round


def test_only_one_agent_with_a_shared_store_gets_round_stores(monkeypatch) -> None:
    """Several agents restart with different counts (a healthy host's agent does not count
    another host's failure), so no per-round key is safe across hosts: env:// stays."""
    for shared, agents, owns, across in [
        ("True", "1", True, False),
        ("True", "2", False, True),
        ("False", "1", False, False),  # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
        (None, None, False, False),  # no torchrun
    ]:
        for name, value in (("TORCHELASTIC_USE_AGENT_STORE", shared), ("GROUP_WORLD_SIZE", agents)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        assert rendezvous.owns_round_store() is owns, (shared, agents)
        assert rendezvous.shared_store_across_hosts() is across, (shared, agents)


def test_the_round_key_names_the_run(monkeypatch) -> None:
    """The agent's store answers anyone: a second torchrun run pointed at it (another
    rendezvous id) publishes its round store under its own key, never over this run's."""
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    keys = set()
    for run in ("run-a", "run-b"):
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", run)
        keys.add(rendezvous.round_key())
    assert keys == {"sparse2d/run-a/round_2/store_port", "sparse2d/run-b/round_2/store_port"}
