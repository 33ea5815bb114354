"""A lost rank becomes one line on every survivor, never a hang or a wall of tracebacks.

``describe`` turns a peer's failure into one line naming the step and, where it can be known,
the lost rank: every rank records each peer's (host, pid) at start and leaves a mark
(``stopped_mark``) before it stops, so a same-host peer gone without a mark is the lost one.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import time

import torch.distributed as dist

_MARKERS = (
    "connection closed by peer",
    "connection reset by peer",
    "connection refused",
    "broken pipe",
    "timed out",
    "timeout",
    "gloo",
    "nccl",
)


def gather_peers() -> list[tuple[str, int]]:
    """Every rank's (hostname, pid), indexed by rank (collective over the world)."""
    peers: list[tuple[str, int] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(peers, (socket.gethostname(), os.getpid()))
    return [p for p in peers if p is not None]


def is_peer_failure(error: BaseException) -> bool:
    """True for errors that mean a peer (or the network to it) is gone."""
    if isinstance(error, dist.DistError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(m in text for m in _MARKERS)


def _fate(pid: int) -> str:
    """``alive``, ``killed`` (ended by a signal), ``exited`` (ended by itself) or ``gone``
    (already reaped: how it ended is unknown)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return "gone"
    if fields[0] not in ("Z", "X"):
        return "alive"
    status = int(fields[49]) if len(fields) > 49 else 0  # exit_code of a zombie (Linux >= 3.5)
    return "killed" if status & 0x7F else "exited"


def stopped_mark(pid: int) -> str:
    """The file a survivor with ``pid`` creates before it stops (so peers do not blame it)."""
    return os.path.join(tempfile.gettempdir(), "sparse2d-stopped", f"{socket.gethostname()}-{pid}")


def mark_stopped() -> None:
    """Tell the peers on this host "I stop because a peer was lost" (best effort)."""
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(stopped_mark(os.getpid())), exist_ok=True)
        with open(stopped_mark(os.getpid()), "w"):
            pass


def lost_ranks(peers: list[tuple[str, int]], settle_s: float = 3.0) -> list[int] | None:
    """Peers on this host that ended without a stop mark (killed, crashed); ``None`` when
    none is found here (the lost rank is unknown from here).

    A connection reset can arrive while the killed process is still being torn down, so
    this looks again for up to ``settle_s`` seconds before giving up.
    """
    host = socket.gethostname()
    local = [(rank, pid) for rank, (h, pid) in enumerate(peers) if h == host]
    deadline = time.monotonic() + settle_s
    while True:
        lost = [
            rank
            for rank, pid in local
            if pid != os.getpid()
            and _fate(pid) != "alive"
            and not os.path.exists(stopped_mark(pid))
        ]
        if lost or time.monotonic() >= deadline:
            return lost or None
        time.sleep(0.1)


def describe(error: BaseException, step: int | None, peers: list[tuple[str, int]] | None) -> str:
    """One line: where training stopped, which rank was lost (if known) and what to do."""
    mark_stopped()
    lost = lost_ranks(peers) if peers else None
    who = (
        f"lost rank(s) {lost}"
        if lost
        else "lost rank unknown (a peer on another host, or the network)"
    )
    where = f"at step {step}" if step is not None else "before training started"
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return (
        f"lost contact with the job {where}: {who}; stopping ({type(error).__name__}: "
        f"{first[:200]}). Restart with launch/*.sh (MAX_RESTARTS) to resume from the latest "
        "checkpoint (train.resume=auto)."
    )
