"""Bytes that crossed host links during training, read from the network interfaces' counters.

The interface ``GLOO_SOCKET_IFNAME`` names is this host's link (on an emulated cluster a
host's own ranks talk over loopback). Local rank 0 reads the kernel's ``tx_bytes`` counter, so
summed over hosts each byte that crossed a link counts once; counting pauses around evaluation
and checkpoints, so the per-step figure is the step's own traffic.
"""

from __future__ import annotations

import os


class LinkBytes:
    """This host's sent bytes while counting is on (zero on every rank but local rank 0)."""

    def __init__(self, interface: str | None, reads: bool) -> None:
        self.interface = interface
        self.enabled = interface is not None
        """The same on every rank (one launcher sets the variable for all): the job-wide
        sum is a collective every rank must join."""
        counter = f"/sys/class/net/{interface}/statistics/tx_bytes"
        self._path = counter if reads and interface is not None else None
        self._since: int | None = None
        self.total = 0

    @classmethod
    def from_env(cls) -> LinkBytes:
        interface = os.environ.get("GLOO_SOCKET_IFNAME") or None
        if interface is not None and "," in interface:  # several interfaces: not one link
            interface = None
        return cls(interface, reads=os.environ.get("LOCAL_RANK", "0") == "0")

    def _read(self) -> int | None:
        if self._path is None:
            return None
        try:
            with open(self._path) as f:
                return int(f.read())
        except (OSError, ValueError):
            return None

    def resume(self) -> None:
        """Start (or go on) counting."""
        self._since = self._read()

    def pause(self) -> None:
        """Stop counting; what was sent since :meth:`resume` is added to :attr:`total`."""
        now = self._read()
        if self._since is not None and now is not None:
            self.total += now - self._since
        self._since = None
