"""The emulated cluster's one topology writer: what the launcher writes and the bench prices."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sparse2d.advisor.topology import load_topology
from sparse2d.errors import ConfigError
from sparse2d.train.emulated_topology import link_bits, topology_yaml


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
