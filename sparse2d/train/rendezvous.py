"""The workers' store for one torchrun restart round, with no port race and no stale keys.

torchrun hands its workers ``MASTER_ADDR:MASTER_PORT`` in one of two ways, and both fail
under restarts:

- **Agent store shared** (torchrun's default): the workers use the agent's store, which
  lives across restart rounds, without a per-round prefix. Restarted workers read the dead
  workers' gloo addresses and torchft manager address left in it ("Connection refused").
- **Not shared** (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``): the agent picks a free port,
  closes it, and worker rank 0 binds it later. On a busy host another process can take the
  port in between: rank 0 dies with EADDRINUSE and the round is lost (a restart spent on
  nothing; seen in the suite).

With one agent (a single-host torchrun: ``launch/local.sh``, each group of
``launch/ft_local.sh``) the agent's store is shared and every worker has the same
``TORCHELASTIC_RESTART_COUNT``. Rank 0 then binds a store of its own on a port the kernel
gives it (no window), and hands the port out through the agent's store under a key of this
round only, and of this torchrun run only (``TORCHELASTIC_RUN_ID``, the rendezvous id): the
agent's store listens on every interface with no authentication, and a second run pointed at
the same address (another job's agent, a mistyped endpoint) would otherwise overwrite the key
and hand this run's ranks its own store. ``MASTER_PORT`` is set to it, so torchft's manager, which reads the variable,
uses the same fresh store. Anything else (one process, several agents, sharing disabled)
keeps ``env://``.
"""

from __future__ import annotations

import datetime
import os

from torch.distributed import Store, TCPStore

ROUND_KEY = "sparse2d/{run}/round_{round}/store_port"
"""The agent-store key under which rank 0 publishes this round's store port."""


def round_key() -> str:
    """This process's :data:`ROUND_KEY`: its torchrun run (the rendezvous id) and restart round."""
    return ROUND_KEY.format(
        run=os.environ.get("TORCHELASTIC_RUN_ID", ""),
        round=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
    )


def _agent_store_shared() -> bool:
    """torchrun shares its agent's store with the workers (its default)."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def owns_round_store() -> bool:
    """True where this process should use :func:`round_store`: torchrun with one agent whose
    store is shared with its workers."""
    return _agent_store_shared() and os.environ.get("GROUP_WORLD_SIZE") == "1"


def round_store(rank: int, timeout: datetime.timedelta) -> Store:
    """This round's store: hosted by rank 0 on a port bound once, found by the others through
    the agent's store. Sets ``MASTER_PORT`` to it for whoever reads the variable later."""
    addr, agent_port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    agent = TCPStore(addr, agent_port, is_master=False, timeout=timeout)
    key = round_key()
    if rank == 0:
        store = TCPStore(addr, 0, is_master=True, wait_for_workers=False, timeout=timeout)
        agent.set(key, str(store.port))
    else:
        port = int(agent.get(key).decode())  # waits for rank 0, up to the timeout
        store = TCPStore(addr, port, is_master=False, timeout=timeout)
    os.environ["MASTER_PORT"] = str(store.port)
    return store


def shared_store_across_hosts() -> bool:
    """torchrun with several agents and a shared store: restarted workers would read stale
    keys, and agents' restart counts differ, so no per-round key is safe (warned by main)."""
    return _agent_store_shared() and not owns_round_store()
