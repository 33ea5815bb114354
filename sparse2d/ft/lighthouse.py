"""The torchft lighthouse: start one (in-process or ``python -m sparse2d.ft.lighthouse``) and
check that one answers before a group registers with it.

The lighthouse forms a quorum of replica groups each step. ``heartbeat_timeout_ms`` is how
long a group that stopped heartbeating still counts as alive: with two groups, a quorum
needs more than half of the heartbeating groups, so the survivors of a lost group wait this
long (after torchrun stopped the lost group's manager rank) before they commit alone.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import os
import signal
import socket
import sys
import time
from typing import Any

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
    server_class: Any = None,
) -> object:
    """An in-process torchft ``LighthouseServer``; ``.address()`` is what groups connect to.
    ``server_class``: the class to build (default: torchft's, imported with its package)."""
    if server_class is None:
        from torchft.coordination import LighthouseServer as server_class

    return server_class(
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


def _server_class_without_torch() -> Any:
    """torchft's ``LighthouseServer`` for a process that only serves: loaded from torchft's
    Rust extension alone, which links no libtorch, because importing the ``torchft`` package
    imports torch (2.4 s of CPU and 230 MB resident against 0.04 s and 14 MB, 2026-11-27; one
    lighthouse per job, started before its groups). The module is registered under its own
    name, so a later ``import torchft`` reuses it instead of initialising it twice. Anything
    unexpected (a torchft layout without this extension) falls back to the package import."""
    name = "torchft._torchft"
    if "torchft" in sys.modules or name in sys.modules:
        return None
    try:
        spec = importlib.util.find_spec("torchft")  # locates the package; imports nothing
        folder = (spec.submodule_search_locations or [""])[0] if spec else ""
        suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
        found = [
            f for f in os.listdir(folder) if f.startswith("_torchft.") and f.endswith(suffixes)
        ]
        loader = importlib.machinery.ExtensionFileLoader(name, os.path.join(folder, found[0]))
        module = importlib.util.module_from_spec(
            importlib.util.spec_from_file_location(name, loader.path, loader=loader)  # type: ignore[arg-type]
        )
        loader.exec_module(module)
    except (ImportError, OSError, IndexError, AttributeError):
        return None
    sys.modules[name] = module
    return module.LighthouseServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparse2d.ft.lighthouse", description=__doc__)
    parser.add_argument("--port", type=int, default=29510)
    parser.add_argument("--min-replicas", type=int, default=1)
    parser.add_argument("--heartbeat-timeout-ms", type=int, default=HEARTBEAT_TIMEOUT_MS)
    parser.add_argument("--join-timeout-ms", type=int, default=JOIN_TIMEOUT_MS)
    parser.add_argument(
        "--port-file",
        help="write the port served to this file once listening (with --port 0: the kernel "
        "picks a free port and binds it at once, so no other process can take it first)",
    )
    args = parser.parse_args(argv)
    server = start_lighthouse(
        args.min_replicas,
        f"[::]:{args.port}",
        args.heartbeat_timeout_ms,
        args.join_timeout_ms,
        _server_class_without_torch(),
    )
    stop = {"now": False}  # before anyone learns the port: a SIGTERM then shuts down cleanly
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    address = server.address()  # type: ignore[attr-defined]
    if args.port_file:  # whole or absent: a reader never sees half a number
        with open(args.port_file + ".tmp", "w") as f:
            f.write(address.rstrip("/").rsplit(":", 1)[1] + "\n")
        os.replace(args.port_file + ".tmp", args.port_file)
    print(f"sparse2d.ft.lighthouse: serving at {address}", flush=True)
    try:
        while not stop["now"]:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    server.shutdown()  # type: ignore[attr-defined]
    return 0


if __name__ == "__main__":
    sys.exit(main())
