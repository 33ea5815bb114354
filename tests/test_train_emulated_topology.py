"""The emulated cluster's one topology writer: what the launcher writes and the bench prices."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sparse2d.advisor.topology import load_topology
from sparse2d.errors import ConfigError
from sparse2d.train.emulated_topology import dilated_link, dilation, link_bits, topology_yaml


def test_link_rates_read_as_tc_reads_them() -> None:
    assert link_bits("200mbit") == 200_000_000 and link_bits("1gbit") == 10**9
    assert link_bits("1.5gbit") == 1_500_000_000 and link_bits("64kbit") == 64_000
    assert link_bits("none") == 0
    for bad in ("12xbit", "fast", "100mb"):
        with pytest.raises(ConfigError, match=rf"LINK='{bad}' is not a rate"):
            link_bits(bad)


def test_the_written_topology_loads_with_the_cluster_shape(tmp_path) -> None:
    path = tmp_path / "topology.yaml"
    path.write_text(topology_yaml(2, 4, "200mbit", "abc12"))
    text = path.read_text()
    assert "host_link_bw: 25000000\n" in text and "ranks_per_host: 4\n" in text
    assert f"cores_per_host: {2 * (os.cpu_count() or 1) / 2}\n" in text
    topology = load_topology(str(path), 8)
    assert topology.world_size == 8
    assert "host_link_bw" not in topology_yaml(2, 4, "none")  # not shaped: no link term


def test_the_launchers_command_line_prints_it_and_refuses_a_bad_rate() -> None:
    run = [sys.executable, "-m", "sparse2d.train.emulated_topology"]
    out = subprocess.run([*run, "yaml", "4", "2", "1gbit", "x"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == topology_yaml(4, 2, "1gbit", "x")
    bad = subprocess.run([*run, "bits", "9zbit"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().startswith("sparse2d: emulated hosts: LINK='9zbit' is not a rate")


def test_a_dilated_cluster_keeps_the_base_cells_compute_to_link_ratio(tmp_path) -> None:
    """Each host's core share falls as 1 / hosts, so its link falls by the same factor: the
    cluster of 8 hosts is the 2-host cell's hosts, 4x slower (catches a factor inverted or
    taken per rank instead of per host)."""
    assert dilation(2) == 1.0 and dilation(4) == 2.0 and dilation(8) == 4.0
    assert dilated_link("200mbit", 2) == "200000000bit"
    assert dilated_link("200mbit", 8) == "50000000bit" and dilated_link("none", 8) == "none"
    for hosts in (2, 4, 6, 8):
        text = topology_yaml(hosts, 4, dilated_link("200mbit", hosts))
        fields = dict(line.split(": ") for line in text.splitlines()[1:])
        per_core = float(fields["host_link_bw"]) / float(fields["cores_per_host"])
        assert per_core == pytest.approx(25_000_000 / (os.cpu_count() or 1))
    # priced as the base cell's hosts: the same cluster in dilated seconds
    base = topology_yaml(8, 4, "200mbit", base_hosts=2)
    assert f"cores_per_host: {float(os.cpu_count() or 1)}\n" in base
    with pytest.raises(ConfigError, match="hosts >= 1"):
        dilation(0)
    out = subprocess.run(
        [sys.executable, "-m", "sparse2d.train.emulated_topology", "dilate", "1gbit", "4"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and out.stdout == "500000000bit\n"
