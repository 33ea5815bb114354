"""Every shipped YAML loads, passes the world-size checks it documents, and has a header."""

from __future__ import annotations

import glob

import pytest

from sparse2d.train.config import load_config

CONFIGS = sorted(glob.glob("configs/*.yaml"))
WORLDS = {
    "tiny_cpu": (4, 4),
    "ft_tiny_cpu": (2, 2),
    "dlrm_criteo_1host_8gpu": (8, 8),
    "dlrm_large_1024gpu": (1024, 8),
    "cluster_cpu": (8, 4),
}


def test_the_shipped_set() -> None:
    assert {c.split("/")[-1][:-5] for c in CONFIGS} == set(WORLDS)


@pytest.mark.parametrize("path", CONFIGS)
def test_shipped_config_loads(path: str) -> None:
    name = path.split("/")[-1][:-5]
    cfg = load_config(path)
    world, local = WORLDS[name]
    cfg.check_runtime(world, local, check_paths=False)
    with open(path) as f:
        header = f.read().split("\n")
    assert header[0].startswith(f"# {name}:")
    assert any("launch/" in line or "make train" in line for line in header if line.startswith("#"))
    if name == "dlrm_large_1024gpu":
        assert cfg.parallel.sharding_group_size == 256 and world // 256 == 4
