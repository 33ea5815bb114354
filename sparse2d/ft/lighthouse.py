"""The torchft lighthouse: start one (in-process or ``python -m sparse2d.ft.lighthouse``) and
check that one answers before a group registers with it.

The lighthouse forms a quorum of replica groups each step. ``heartbeat_timeout_ms`` is how
long a group that stopped heartbeating still counts as alive: with two groups, a quorum
needs more than half of the heartbeating groups, so the survivors of a lost group wait this
long (after torchrun stopped the lost group's manager rank) before they commit alone.
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import time

from sparse2d.errors import FaultToleranceError

HEARTBEAT_TIMEOUT_MS = 2000
"""torchft's default is 5000; 2 s still tolerates a 20x late 100 ms heartbeat on 2 busy cores."""
JOIN_TIMEOUT_MS = 5000
"""Wait this long for heartbeating groups that have not asked for a quorum yet (torchft: 60 s)."""


def start_lighthouse(
    min_replicas: int,
    bind: str = "[::]:0",
    heartbeat_timeout_ms: int = HEARTBEAT_TIMEOUT_MS,
    join_timeout_ms: int = JOIN_TIMEOUT_MS,
) -> object:
    """An in-process torchft ``LighthouseServer``; ``.address()`` is what groups connect to."""
    from torchft.coordination import LighthouseServer

    return LighthouseServer(
        bind=bind,
        min_replicas=min_replicas,
        join_timeout_ms=join_timeout_ms,
        quorum_tick_ms=50,
        heartbeat_timeout_ms=heartbeat_timeout_ms,
    )


def check_reachable(address: str, timeout_s: float) -> None:
    """Raise ``FaultToleranceError`` unless a TCP connection to the lighthouse opens within ``timeout_s``.

    Run on every rank before the manager is built: torchft's own failure would surface on
    rank 0 only, while the other ranks wait for its manager address.
    """
    host_port = address.split("://", 1)[-1].rstrip("/")
    host, _, port = host_port.rpartition(":")
    host = host.strip("[]")
    deadline = time.monotonic() + timeout_s
    error: OSError | None = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(
                (host, int(port)), timeout=max(0.1, deadline - time.monotonic())
            ):
                return
        except OSError as e:
            error = e
            time.sleep(0.2)
    raise FaultToleranceError(
        f"lighthouse {address} unreachable within {timeout_s:g} s ({error}); start it "
        "(python -m sparse2d.ft.lighthouse or torchft_lighthouse) or fix "
        "fault_tolerance.lighthouse / TORCHFT_LIGHTHOUSE"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparse2d.ft.lighthouse", description=__doc__)
    parser.add_argument("--port", type=int, default=29510)
    parser.add_argument("--min-replicas", type=int, default=1)
    parser.add_argument("--heartbeat-timeout-ms", type=int, default=HEARTBEAT_TIMEOUT_MS)
    parser.add_argument("--join-timeout-ms", type=int, default=JOIN_TIMEOUT_MS)
    args = parser.parse_args(argv)
    server = start_lighthouse(
        args.min_replicas, f"[::]:{args.port}", args.heartbeat_timeout_ms, args.join_timeout_ms
    )
    print(f"sparse2d.ft.lighthouse: serving at {server.address()}", flush=True)  # type: ignore[attr-defined]
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    try:
        while not stop["now"]:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    server.shutdown()  # type: ignore[attr-defined]
    return 0


if __name__ == "__main__":
    sys.exit(main())
