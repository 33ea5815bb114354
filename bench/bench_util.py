"""What every benchmark script shares: a rendezvous port and the RESULTS.md section writer."""

from __future__ import annotations

import os
import socket

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md")


def free_port() -> int:
    """A free TCP port on loopback for the benchmark's own gloo rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_section(text: str, marker: str, path: str | os.PathLike[str] = RESULTS) -> None:
    """Replace the ``marker`` section of ``path`` (between its HTML comments), or append it.

    Re-running a benchmark therefore updates its own section and leaves the others alone.
    """
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    old = open(path).read() if os.path.exists(path) else "# Benchmark results\n"
    block = f"{begin}\n{text.strip()}\n{end}"
    if begin in old and end in old:
        new = old[: old.index(begin)] + block + old[old.index(end) + len(end) :]
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(new)
