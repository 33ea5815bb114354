"""The cluster the group-size advisor plans for: ranks, hosts, memory, links.

A ``ClusterTopology`` is plain data (no process group, no device), so the advisor
can plan for 4096 GPUs on a laptop. Presets describe common hosts; a YAML file or
``key=value`` overrides adjust any field (``base: h100_8x`` in YAML starts from a preset).
Bandwidths are *effective* per-rank bytes/s that a collective reaches, not link peaks.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from sparse2d.errors import ConfigError

GiB = 2**30


def byte_text(nbytes: float, sep: str = "") -> str:
    """``98.15GiB``, ``1.56MiB``, ``640B``: the largest binary unit that keeps the number at
    least 1, so a small table is not ``0.00GiB``."""
    for unit, size in (("TiB", 2**40), ("GiB", GiB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= size:
            return f"{nbytes / size:.2f}{sep}{unit}"
    return f"{nbytes:.0f}{sep}B"


@dataclass(kw_only=True, slots=True)
class ClusterTopology:
    """Hardware of a job: how many ranks, how they sit on hosts, what links join them."""

    name: str = "custom"
    """Label shown in reports."""
    world_size: int = 8
    """Ranks in the job (``T``)."""
    ranks_per_host: int = 8
    """Ranks sharing one host (and its fast intra-host links)."""
    compute_device: Literal["cuda", "cpu"] = "cuda"
    """Where embeddings live; decides the TorchRec kernels and storage kind (HBM or DDR)."""
    device_memory_bytes: int = 80 * GiB
    """Memory of one rank's device available to the job."""
    reserved_fraction: float = 0.15
    """Share of device memory kept for dense layers, activations and the allocator."""
    intra_host_bw: float = 370e9
    """Effective per-rank bandwidth (bytes/s) of collectives inside one host (NVLink, shm)."""
    intra_host_latency_s: float = 2e-6
    """Per-message latency inside a host (seconds)."""
    inter_host_bw: float = 44e9
    """Effective per-rank bandwidth (bytes/s) of collectives across hosts (one NIC per rank)."""
    inter_host_latency_s: float = 8e-6
    """Per-message latency across hosts (seconds)."""
    host_link_bw: float = 0.0
    """Bytes/s of one host's link to the other hosts, shared by all of its ranks (one NIC per
    host, or an emulated host's shaped link, ``launch/emulated_hosts.sh``). A rank's share,
    ``host_link_bw / ranks_per_host``, caps ``inter_host_bw``; an all-reduce whose ring
    crosses a host's link once (its members on a host adjacent) gets the whole link.
    0: no limit beyond ``inter_host_bw``."""
    lookup_bw: float = 1.3e12
    """Bytes/s one rank streams through embedding lookups (forward + backward)."""
    row_update_s: float = 0.0
    """Seconds per distinct embedding row one rank's fused optimizer updates in a step: the
    backward groups ids by row and updates each touched row once. 0: not priced."""
    dense_flops: float = 2.0e14
    """Effective FLOP/s of the dense (MLP) part on one rank."""
    cores_per_host: float = 0.0
    """CPU cores the ranks of one host share for embedding compute and framework work; when
    ranks outnumber them (a CPU box), that work slows by ranks / cores. 0: not shared (GPUs)."""
    step_overhead_s: float = 0.0
    """Fixed per-step time not modelled elsewhere (framework, launches)."""
    sync_overhead_s: float = 0.0
    """Fixed cost of one replica sync besides its all-reduce (finite-value vote, copies)."""
    allreduce_latency: Literal["tree", "ring"] = "tree"
    """Latency steps of an all-reduce over n ranks: ``tree`` 2 log2(n) (NCCL at scale),
    ``ring`` 2 (n - 1) (gloo)."""
    a2a_bw_factor: float = 1.0
    """All-to-all bandwidth as a fraction of the all-reduce bandwidth above (pairwise
    exchange, and on CPU the embedding permutes and splits around it)."""
    a2a_value_s: float = 0.0
    """CPU seconds per pooled-embedding value one rank moves through the output all-to-all
    whatever the wire precision (TorchRec's permutes, splits and copies around it, a qcomm
    codec's encode and decode). 0: not priced (on GPUs the device does it in-stream)."""
    scatter_bw_factor: float = 1.0
    """Bandwidth of the row-wise output dist (a reduce-scatter forward, an all-gather
    backward; TWRW/grid's intra-host part too) as a fraction of the all-reduce bandwidth."""
    comm_overlap: float = 1.0
    """Fraction of concurrent work a background transfer (pipelined input all-to-all, hidden
    sync) can hide behind: 1 with separate CUDA streams, 0 on a CPU box where ranks share cores."""

    def __post_init__(self) -> None:
        for key in ("world_size", "ranks_per_host", "device_memory_bytes"):
            if getattr(self, key) < 1:
                raise ConfigError(f"topology.{key}={getattr(self, key)} must be >= 1.")
        for key in ("intra_host_bw", "inter_host_bw", "lookup_bw", "dense_flops"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"topology.{key}={getattr(self, key)} must be > 0.")
        for key in (
            "intra_host_latency_s",
            "inter_host_latency_s",
            "step_overhead_s",
            "sync_overhead_s",
            "row_update_s",
            "a2a_value_s",
            "host_link_bw",
        ):
            if getattr(self, key) < 0:
                raise ConfigError(f"topology.{key}={getattr(self, key)} must be >= 0.")
        if self.cores_per_host < 0:
            raise ConfigError(
                f"topology.cores_per_host={self.cores_per_host} must be >= 0 (0: not shared)."
            )
        for key in ("a2a_bw_factor", "scatter_bw_factor"):
            if not 0 < getattr(self, key) <= 10:
                raise ConfigError(f"topology.{key}={getattr(self, key)} must be in (0, 10].")
        if not 0 <= self.comm_overlap <= 1:
            raise ConfigError(f"topology.comm_overlap={self.comm_overlap} must be in [0, 1].")
        if not 0 <= self.reserved_fraction < 1:
            raise ConfigError(
                f"topology.reserved_fraction={self.reserved_fraction} must be in [0, 1)."
            )
        if self.allreduce_latency not in ("tree", "ring"):
            raise ConfigError(
                f"topology.allreduce_latency={self.allreduce_latency!r} must be 'tree' or 'ring'."
            )
        if self.compute_device not in ("cuda", "cpu"):
            raise ConfigError(
                f"topology.compute_device={self.compute_device!r} must be 'cuda' or 'cpu'."
            )

    @property
    def usable_memory_bytes(self) -> int:
        """Device memory left for embedding shards after the reserve."""
        return int(self.device_memory_bytes * (1 - self.reserved_fraction))

    @property
    def hosts(self) -> int:
        return math.ceil(self.world_size / self.ranks_per_host)

    def host_of(self, rank: int) -> int:
        return rank // self.ranks_per_host

    def with_world_size(self, world_size: int) -> ClusterTopology:
        return dataclasses.replace(self, world_size=world_size)


PRESET_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "presets")
"""Preset topologies as YAML data, each field with its source (``presets/*.yaml``)."""


def _read_yaml(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except OSError as error:
        raise ConfigError(f"--topology {path!r}: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a topology file must be a mapping of field: value.")
    return data


def _load_presets() -> dict[str, ClusterTopology]:
    presets: dict[str, ClusterTopology] = {}
    files = sorted(f for f in os.listdir(PRESET_DIR) if f.endswith(".yaml"))
    pending = {f[:-5]: _read_yaml(os.path.join(PRESET_DIR, f)) for f in files}
    while pending:  # a preset may name another as its base
        ready = [n for n, d in pending.items() if d.get("base") in (None, *presets)]
        if not ready:
            raise ConfigError(f"presets {sorted(pending)} name unknown or circular bases.")
        for name in ready:
            data = dict(pending.pop(name))
            base = data.pop("base", None)
            values = dataclasses.asdict(presets[base]) if base else {}
            values.update({k: _coerce(k, v) for k, v in data.items()})
            presets[name] = ClusterTopology(**values)
    return presets


def _fields() -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(ClusterTopology)}


def _coerce(key: str, value: Any) -> Any:
    field = _fields().get(key)
    if field is None:
        raise ConfigError(f"topology key {key!r} is unknown; valid keys: {sorted(_fields())}.")
    if isinstance(value, str) and key not in ("name", "compute_device", "allreduce_latency"):
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(f"topology.{key}={value!r} must be a number.") from None
    if key in ("world_size", "ranks_per_host", "device_memory_bytes") and value is not None:
        if float(value) != int(float(value)):
            raise ConfigError(f"topology.{key}={value!r} must be an integer.")
        value = int(float(value))
    return value


def load_topology(
    name_or_path: str = "h100_8x",
    world_size: int | None = None,
    overrides: list[str] | tuple[str, ...] = (),
) -> ClusterTopology:
    """A preset name or a YAML file (optionally ``base: PRESET``), then ``key=value`` overrides."""
    values: dict[str, Any]
    if name_or_path in PRESETS:
        values = dataclasses.asdict(PRESETS[name_or_path])
    elif name_or_path.endswith((".yaml", ".yml")):
        data = _read_yaml(name_or_path)
        base = data.pop("base", None)
        if base is not None and base not in PRESETS:
            raise ConfigError(f"{name_or_path}: base={base!r} is unknown; use {sorted(PRESETS)}.")
        values = dataclasses.asdict(PRESETS[base]) if base else {"name": name_or_path}
        values.update({k: _coerce(k, v) for k, v in data.items()})
    else:
        raise ConfigError(
            f"--topology {name_or_path!r} is neither a preset ({sorted(PRESETS)}) nor a .yaml file."
        )
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"topology override {item!r} must look like key=value.")
        values[key.strip()] = _coerce(key.strip(), value.strip())
    if world_size is not None:
        values["world_size"] = world_size
    return ClusterTopology(**values)


PRESETS: dict[str, ClusterTopology] = _load_presets()
"""``h100_8x``, ``h200_8x``, ``cpu_gloo``: read from ``presets/*.yaml``."""
