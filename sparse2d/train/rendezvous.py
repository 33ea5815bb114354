"""The workers' store for one torchrun restart round, with no port race and no stale keys.

torchrun's shared agent store lives across restart rounds with no per-round prefix (restarted
workers read the dead workers' addresses), and with sharing disabled the agent's free port can
be taken before rank 0 binds it (EADDRINUSE, a lost round). With one agent, rank 0 binds a
store of its own on a port the kernel gives it and hands the port out through the agent's store
under a key of this round and this run only (``TORCHELASTIC_RUN_ID``: the agent's store is
unauthenticated, and another run at the same address must not hand this run's ranks its
store). ``MASTER_PORT`` is set to it, so torchft's manager uses the same store. Anything else
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
