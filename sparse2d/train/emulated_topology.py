"""What the advisor prices under ``launch/emulated_hosts.sh``: one writer of its ``topology.yaml``.

The launcher runs ``python -m sparse2d.train.emulated_topology`` (``bits LINK``, ``yaml HOSTS
NPROC LINK ID``) and the cluster bench imports the same functions, so the two never describe
different clusters. Each host is priced with twice its even share of the cores (why, and the
fit: docs/advisor_cost_model.md, section 8). ``dilation``/``dilated_link``: a cluster of more
hosts on the same cores computes ``hosts / base_hosts`` slower, so its link is shaped to
``LINK x base_hosts / hosts`` to keep the base cell's compute-to-link ratio.
"""

from __future__ import annotations

import os
import sys

from sparse2d.errors import ConfigError

UNITS = {"gbit": 10**9, "mbit": 10**6, "kbit": 10**3, "bit": 1}
"""tc's rate units (``tc-tbf(8)``), longest suffix first."""


def link_bits(rate: str) -> int:
    """Bits per second of a tc rate (``200mbit``, ``1gbit``; ``none``: 0, not shaped)."""
    if rate == "none":
        return 0
    for unit, scale in UNITS.items():
        number = rate.removesuffix(unit)
        if number != rate:
            try:
                return int(float(number) * scale)
            except ValueError:
                break
    raise ConfigError(
        f"LINK={rate!r} is not a rate; use a number with bit, kbit, mbit or gbit "
        "(e.g. LINK=200mbit) or LINK=none"
    )


BASE_HOSTS = 2
"""The cell dilated clusters are scaled to: 2 hosts, each with the whole machine's cores
(priced as ``cores_per_host``), the cluster benchmark's cells."""


def dilation(hosts: int, base_hosts: int = BASE_HOSTS) -> float:
    """How many times slower every host of a ``hosts``-host emulated cluster computes than one
    of the ``base_hosts`` cell (same ranks per host): the cores are shared evenly by all ranks,
    so a host's share of them is ``1 / hosts``. Its links are scaled by ``1 / dilation``."""
    if hosts < 1 or base_hosts < 1:
        raise ConfigError(f"dilation needs hosts >= 1 (got hosts={hosts}, base={base_hosts})")
    return hosts / base_hosts


def dilated_link(link: str, hosts: int, base_hosts: int = BASE_HOSTS) -> str:
    """The tc rate that gives a ``hosts``-host cluster the compute-to-link ratio ``link`` gives
    the ``base_hosts`` cell (whole bits per second; ``none`` stays unshaped)."""
    bits = link_bits(link)
    if not bits:
        return "none"
    return f"{round(bits / dilation(hosts, base_hosts))}bit"


def topology_yaml(
    hosts: int, nproc: int, link: str, run_id: str = "", base_hosts: int | None = None
) -> str:
    """The ``topology.yaml`` of an emulated cluster of ``hosts`` x ``nproc`` ranks. With
    ``base_hosts``: every host priced as one of the ``base_hosts`` cell (its cores), the
    dilated cluster in dilated seconds (``link`` then the base cell's rate)."""
    bits = link_bits(link)
    cores = 2 * (os.cpu_count() or 1) / (base_hosts or hosts)
    lines = [
        f"# written by launch/emulated_hosts.sh for run {run_id}: {hosts} hosts x {nproc} "
        f"ranks, links {link}",
        "base: cpu_gloo",
        f"name: emulated_{hosts}x{nproc}_{link}",
        f"world_size: {hosts * nproc}",
        f"ranks_per_host: {nproc}",
        f"cores_per_host: {cores}",
    ]
    if bits:
        lines.append(f"host_link_bw: {bits // 8}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """``bits LINK``, ``dilate LINK HOSTS`` or ``yaml HOSTS NPROC LINK ID``, printed; a bad
    value is one line, rc 2."""
    try:
        if len(argv) == 2 and argv[0] == "bits":
            print(link_bits(argv[1]))
        elif len(argv) == 3 and argv[0] == "dilate":
            print(dilated_link(argv[1], int(argv[2])))
        elif len(argv) == 5 and argv[0] == "yaml":
            print(topology_yaml(int(argv[1]), int(argv[2]), argv[3], argv[4]), end="")
        else:
            print(
                "usage: emulated_topology bits LINK | dilate LINK HOSTS | yaml HOSTS NPROC LINK ID",
                file=sys.stderr,
            )
            return 2
    except ConfigError as error:
        print(f"sparse2d: emulated hosts: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
