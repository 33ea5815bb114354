"""``sparse2d.train.link_bytes``: bytes sent on a host's link, from the kernel's own counter."""

from __future__ import annotations

import socket

import pytest

from sparse2d.train.link_bytes import LinkBytes


def _send_over_loopback(nbytes: int) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
        with client, peer:
            client.sendall(b"x" * nbytes)
            got = 0
            while got < nbytes:
                got += len(peer.recv(1 << 20))


def test_counts_what_was_sent_while_counting_only() -> None:
    """Loopback's counter: what a socket sent while counting is in the total (with TCP's own
    headers and acknowledgements), what it sent while paused is not."""
    link = LinkBytes("lo", reads=True)
    link.resume()
    _send_over_loopback(2_000_000)
    link.pause()
    counted = link.total
    assert 2_000_000 <= counted < 3_000_000
    _send_over_loopback(2_000_000)  # paused: not the steps' traffic
    link.resume()
    link.pause()
    assert link.total - counted < 500_000


@pytest.mark.parametrize(
    ("env", "enabled", "reads"),
    [
        ({"GLOO_SOCKET_IFNAME": "eth0", "LOCAL_RANK": "0"}, True, True),
        ({"GLOO_SOCKET_IFNAME": "eth0", "LOCAL_RANK": "3"}, True, False),  # one reader a host
        ({"GLOO_SOCKET_IFNAME": "eth0,eth1"}, False, False),  # several interfaces: not one link
        ({}, False, False),
    ],
)
def test_from_env(monkeypatch, env: dict, enabled: bool, reads: bool) -> None:
    for key in ("GLOO_SOCKET_IFNAME", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    link = LinkBytes.from_env()
    assert link.enabled is enabled
    assert (link._path is not None) is reads
