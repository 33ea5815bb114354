"""The torchft lighthouse: start one (in-process or ``python -m sparse2d.ft.lighthouse``) and
check that one answers before a group registers with it.

The lighthouse forms a quorum of replica groups each step. ``heartbeat_timeout_ms`` is how
long a group that stopped heartbeating still counts as alive: with two groups, a quorum
needs more than half of the heartbeating groups, so the survivors of a lost group wait this
long (after torchrun stopped the lost group's manager rank) before they commit alone.

One lighthouse serves one job. A launcher names its job (``$SPARSE2D_FT_JOB``: it mints one
and passes ``--job-id``); the lighthouse process then carries the name on torchft's own status
page (``GET /status`` lists every replica id that ever heartbeated: one heartbeat of
``sparse2d_lighthouse_job:<job>`` at start), and each group's torchft replica id carries it too
(``replica_id``). Before a group registers, ``check_job`` reads that page and refuses a
lighthouse marked for another job, or an unmarked one where another job's groups heartbeat: torchft forms
a quorum of whatever groups reach a lighthouse, so a group that reached another job's would
heal from (or into) that job's state. The marker's single heartbeat counts as a live group for
``heartbeat_timeout_ms`` after the lighthouse starts, long before a group has imported torch.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.machinery
import importlib.util
import os
import re
import signal
import socket
import sys
import time
import urllib.request
from typing import Any

from sparse2d.errors import ConfigError, FaultToleranceError, Sparse2DError

HEARTBEAT_TIMEOUT_MS = 2000
"""torchft's default is 5000; 2 s still tolerates a 20x late 100 ms heartbeat on 2 busy cores."""
JOIN_TIMEOUT_MS = 5000
"""Wait this long for heartbeating groups that have not asked for a quorum yet (torchft: 60 s)."""
JOB_ENV = "SPARSE2D_FT_JOB"
"""The job a group belongs to, set by the launcher (letters, digits, ``.`` and ``-``)."""
JOB_MARK = "sparse2d_lighthouse_job:"
"""The replica id the lighthouse process heartbeats once, followed by its job."""
_JOB = r"[A-Za-z0-9.-]+"
_MARKED = re.compile(re.escape(JOB_MARK) + f"({_JOB})")
_GROUPED = re.compile(rf"sparse2d_job_({_JOB})_group_[0-9]+")


def checked_job(job: str | None = None) -> str | None:
    """``job``, else ``$SPARSE2D_FT_JOB``, checked for form; None when neither is set."""
    job = job or os.environ.get(JOB_ENV) or None
    if job is not None and not re.fullmatch(_JOB, job):
        raise ConfigError(
            f"{JOB_ENV}={job!r} must be letters, digits, '.' and '-' only (e.g. ft-1764300000)"
        )
    return job


def replica_id(group: int, job: str | None) -> str:
    """Group ``group``'s torchft replica id (its trailing digits stay the group's index)."""
    return f"sparse2d_job_{job}_group_{group}" if job else f"sparse2d_group_{group}"


def job_replica_ids(job: str | None) -> re.Pattern[str]:
    """What every replica id of ``job``'s groups matches (torchft's ``:uuid`` suffix removed)."""
    return re.compile(re.escape(replica_id(0, job))[: -len("0")] + "[0-9]+")


def lighthouse_jobs(address: str, timeout_s: float) -> tuple[set[str], set[str]]:
    """(jobs the lighthouse is marked for, jobs whose groups ever heartbeated there), read
    from torchft's status page."""
    url = address.rstrip("/") + "/status"
    with urllib.request.urlopen(url, timeout=timeout_s) as answer:  # noqa: S310 (http only)
        page = answer.read().decode(errors="replace")
    return set(_MARKED.findall(page)), set(_GROUPED.findall(page))


def check_job(address: str, job: str | None, timeout_s: float) -> None:
    """Raise ``FaultToleranceError`` unless the lighthouse at ``address`` may serve a group of
    ``job`` (module docstring): no other job's mark, and, on a lighthouse with no mark, no other
    job's groups. A lighthouse marked for ``job`` serves it whoever else heartbeated there: the
    mark is set before anyone learns the port, and a stranger's one quorum request (listed on
    the page from then on) would otherwise stop every later restart of the job's groups."""
    try:
        marked, grouped = lighthouse_jobs(address, timeout_s)
    except (OSError, ValueError) as error:
        raise FaultToleranceError(
            f"{address} answers, but not as a torchft lighthouse (GET /status: {error}); fix "
            "fault_tolerance.lighthouse / TORCHFT_LIGHTHOUSE"
        ) from None
    others = sorted((marked or grouped) - {job})
    if others:
        mine = f"job {job}" if job else f"no job ({JOB_ENV} unset)"
        raise FaultToleranceError(
            f"lighthouse {address} serves job {others[0]}, and this group belongs to {mine}: a "
            "group never joins another job's quorum; give this job its own lighthouse "
            f"(launch/ft_local.sh starts one on a free port) or, if this group is part of "
            f"that job, export {JOB_ENV}={others[0]}"
        )


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


def _mark(address: str, job: str, module: Any) -> None:
    """Heartbeat once as ``JOB_MARK + job``: the status page lists the name from then on."""
    if module is None:
        from torchft import _torchft as module
    client = module.LighthouseClient(address, datetime.timedelta(seconds=10))
    client.heartbeat(JOB_MARK + job)


def _rust_module_without_torch() -> Any:
    """torchft's Rust extension (its ``LighthouseServer`` and ``LighthouseClient``) for a
    process that only serves: loaded alone, as it links no libtorch, because importing the
    ``torchft`` package imports torch (2.4 s of CPU and 230 MB resident against 0.04 s and 14 MB, 2026-11-27; one
    lighthouse per job, started before its groups). The module is registered under its own
    name, so a later ``import torchft`` reuses it instead of initialising it twice. Anything
    unexpected (a torchft layout without this extension) returns None: the package import."""
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
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparse2d.ft.lighthouse", description=__doc__)
    parser.add_argument("--port", type=int, default=29510)
    parser.add_argument(
        "--host",
        default="::",
        help="the address to listen on (default: every interface); torchft's lighthouse has "
        "no authentication, so a launcher binds the one its groups reach it by "
        "(launch/ft_local.sh: 127.0.0.1)",
    )
    parser.add_argument(
        "--job-id", default=None, help=f"the job this lighthouse serves (default: ${JOB_ENV})"
    )
    parser.add_argument(
        "--check",
        metavar="ADDRESS",
        help=f"do not serve: check that the lighthouse at ADDRESS may serve ${JOB_ENV}'s groups",
    )
    parser.add_argument("--min-replicas", type=int, default=1)
    parser.add_argument("--heartbeat-timeout-ms", type=int, default=HEARTBEAT_TIMEOUT_MS)
    parser.add_argument("--join-timeout-ms", type=int, default=JOIN_TIMEOUT_MS)
    parser.add_argument(
        "--port-file",
        help="write the port served to this file once listening (with --port 0: the kernel "
        "picks a free port and binds it at once, so no other process can take it first)",
    )
    args = parser.parse_args(argv)
    try:
        job = checked_job(args.job_id)
        if args.check:
            check_reachable(args.check, 10.0)
            check_job(args.check, job, 10.0)
            return 0
        module = _rust_module_without_torch()
        server: Any = start_lighthouse(
            args.min_replicas,
            f"[{args.host}]:{args.port}" if ":" in args.host else f"{args.host}:{args.port}",
            args.heartbeat_timeout_ms,
            args.join_timeout_ms,
            getattr(module, "LighthouseServer", None),
        )
    except Sparse2DError as error:  # a bad job id, another job's lighthouse
        print(f"sparse2d.ft.lighthouse: {error}", file=sys.stderr)
        return 1
    except RuntimeError as error:  # torchft's bind error: "Address already in use"
        print(
            f"sparse2d.ft.lighthouse: cannot serve on port {args.port} ({error}); another "
            "job's lighthouse? --port 0 (LIGHTHOUSE_PORT=0) binds a free port",
            file=sys.stderr,
        )
        return 1
    stop = {"now": False}  # before anyone learns the port: a SIGTERM then shuts down cleanly
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    address = server.address()  # http://<this host's name>:<port>
    if args.host != "::":  # the name may not resolve to the one address served
        address = f"http://{args.host}:{address.rstrip('/').rsplit(':', 1)[1]}"
    if job:  # before anyone learns the port: no group can look before the mark is there
        _mark(address, job, module)
    if args.port_file:  # whole or absent: a reader never sees half a number
        with open(args.port_file + ".tmp", "w") as f:
            f.write(address.rstrip("/").rsplit(":", 1)[1] + "\n")
        os.replace(args.port_file + ".tmp", args.port_file)
    serving = f"job {job} " if job else ""
    print(f"sparse2d.ft.lighthouse: serving {serving}at {address}", flush=True)
    try:
        while not stop["now"]:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
