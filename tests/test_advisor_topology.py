"""Cluster topologies: presets, YAML files with a base, key=value overrides, bad values."""

from __future__ import annotations

import pytest

from sparse2d.advisor.topology import PRESETS, GiB, load_topology
from sparse2d.errors import ConfigError


def test_presets_describe_their_hosts() -> None:
    h100, h200 = load_topology("h100_8x", 16), load_topology("h200_8x", 16)
    assert (h100.ranks_per_host, h100.device_memory_bytes, h100.hosts) == (8, 80 * GiB, 2)
    assert h200.device_memory_bytes > h100.device_memory_bytes
    assert h100.inter_host_bw < h100.intra_host_bw
    assert load_topology("cpu_gloo", 4).compute_device == "cpu"
    assert h100.usable_memory_bytes == int(80 * GiB * 0.85)


def test_yaml_with_base_and_overrides(tmp_path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("base: h100_8x\nname: mine\nranks_per_host: 4\ninter_host_bw: 2.5e10\n")
    topo = load_topology(str(path), 32, ["device_memory_bytes=1e9"])
    assert (topo.name, topo.ranks_per_host, topo.inter_host_bw) == ("mine", 4, 2.5e10)
    assert (topo.world_size, topo.device_memory_bytes) == (32, 10**9)
    assert topo.intra_host_bw == PRESETS["h100_8x"].intra_host_bw


@pytest.mark.parametrize(
    ("name", "overrides", "match"),
    [
        ("nope", [], "neither a preset"),
        ("h100_8x", ["colour=red"], "'colour' is unknown"),
        ("h100_8x", ["inter_host_bw=-1"], "inter_host_bw=-1.0 must be > 0"),
        ("h100_8x", ["ranks_per_host=2.5"], "must be an integer"),
        ("h100_8x", ["reserved_fraction=1"], r"reserved_fraction=1.0 must be in \[0, 1\)"),
        ("h100_8x", ["lookup_bw"], "must look like key=value"),
        ("cpu_gloo", ["cores_per_host=-2"], "cores_per_host=-2.0 must be >= 0"),
        ("cpu_gloo", ["row_update_s=-1e-7"], "row_update_s=-1e-07 must be >= 0"),
        ("cpu_gloo", ["a2a_value_s=-1"], "a2a_value_s=-1.0 must be >= 0"),
    ],
)
def test_bad_topologies_name_the_key(name: str, overrides: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_topology(name, 8, overrides)
