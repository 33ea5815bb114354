"""``sparse2d.ft.lighthouse``: an in-process torchft lighthouse and the reachability check."""

from __future__ import annotations

import socket
import time

import pytest

from sparse2d.errors import FaultToleranceError
from sparse2d.ft.lighthouse import check_reachable, start_lighthouse


def test_reachable_lighthouse_passes_the_check() -> None:
    server = start_lighthouse(min_replicas=1)
    try:
        check_reachable(server.address(), timeout_s=5)
    finally:
        server.shutdown()


def test_unreachable_lighthouse_fails_in_one_line_within_the_timeout() -> None:
    with socket.socket() as s:  # bound, never listening: refused, and nobody else takes it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        start = time.monotonic()
        _refused(port)
    assert time.monotonic() - start < 3


def _refused(port: int) -> None:
    with pytest.raises(
        FaultToleranceError, match=rf"lighthouse http://127.0.0.1:{port} unreachable within 1 s"
    ):
        check_reachable(f"http://127.0.0.1:{port}", timeout_s=1)
