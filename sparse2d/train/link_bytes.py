"""Bytes that crossed host links during training, read from the network interfaces' counters.

The interface ``GLOO_SOCKET_IFNAME`` names is this host's link (on an emulated cluster a
host's own ranks talk over loopback). Local rank 0 reads the kernel's ``tx_bytes`` and
``tx_packets`` counters, so summed over hosts each byte that crossed a link counts once.
Counting pauses around evaluation and checkpoints and runs while the sync started at the last
step lands (``landing``), so the per-step figure is the steps' own traffic; bytes include each
packet's headers (``FRAME_HEADER_BYTES``; the packet count says how much is framing).
"""

from __future__ import annotations

import os

FRAME_HEADER_BYTES = 66
"""Headers the counter includes per packet of a TCP/IPv4 stream: Ethernet 14, IPv4 20, TCP 20
plus Linux's default timestamp option 12. A segmentation-offload packet carries one set for
all its payload, so ``bytes - FRAME_HEADER_BYTES x packets`` is the payload either way."""


class LinkBytes:
    """This host's sent bytes while counting is on (zero on every rank but local rank 0)."""

    def __init__(self, interface: str | None, reads: bool) -> None:
        self.interface = interface
        self.enabled = interface is not None
        """The same on every rank (one launcher sets the variable for all): the job-wide
        sum is a collective every rank must join."""
        counter = f"/sys/class/net/{interface}/statistics/tx_"
        self._path = counter if reads and interface is not None else None
        self._since: tuple[int, int] | None = None
        self.total = 0
        self.packets = 0
        self.landing = 0
        """Of ``total``: bytes sent while the last step's sync landed (``pause(landing=True)``)."""

    @classmethod
    def from_env(cls) -> LinkBytes:
        interface = os.environ.get("GLOO_SOCKET_IFNAME") or None
        if interface is not None and "," in interface:  # several interfaces: not one link
            interface = None
        return cls(interface, reads=os.environ.get("LOCAL_RANK", "0") == "0")

    def _read(self) -> tuple[int, int] | None:
        """(bytes, packets) sent so far, None where this rank does not read."""
        if self._path is None:
            return None
        try:
            with open(self._path + "bytes") as f, open(self._path + "packets") as g:
                return int(f.read()), int(g.read())
        except (OSError, ValueError):
            return None

    def resume(self) -> None:
        """Start (or go on) counting."""
        self._since = self._read()

    def pause(self, landing: bool = False) -> None:
        """Stop counting; what was sent since :meth:`resume` is added to :attr:`total` (and
        to :attr:`landing` when it was the last step's sync landing)."""
        now = self._read()
        if self._since is not None and now is not None:
            sent = now[0] - self._since[0]
            self.total += sent
            self.packets += now[1] - self._since[1]
            self.landing += sent if landing else 0
        self._since = None
