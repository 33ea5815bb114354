"""The cluster the group-size advisor plans for: ranks, hosts, memory, links.

A ``ClusterTopology`` is plain data (no process group, no device), so the advisor
can plan for 4096 GPUs on a laptop. Presets describe common hosts; a YAML file or
``key=value`` overrides adjust any field (``base: h100_8x`` in YAML starts from a preset).
Bandwidths are *effective* per-rank bytes/s that a collective reaches, not link peaks.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from sparse2d.errors import ConfigError

GiB = 2**30


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
    lookup_bw: float = 1.3e12
    """Bytes/s one rank streams through embedding lookups (forward + backward)."""
    dense_flops: float = 2.0e14
    """Effective FLOP/s of the dense (MLP) part on one rank."""
    step_overhead_s: float = 0.0
    """Fixed per-step time not modelled elsewhere (framework, launches)."""
    sync_overhead_s: float = 0.0
    """Fixed cost of one replica sync besides its all-reduce (finite-value vote, copies)."""
    allreduce_latency: Literal["tree", "ring"] = "tree"
    """Latency steps of an all-reduce over n ranks: ``tree`` 2 log2(n) (NCCL at scale),
    ``ring`` 2 (n - 1) (gloo)."""

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
        ):
            if getattr(self, key) < 0:
                raise ConfigError(f"topology.{key}={getattr(self, key)} must be >= 0.")
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


PRESETS: dict[str, ClusterTopology] = {
    # 8x H100 SXM 80 GB per host: NVLink 4 (450 GB/s per direction, ~370 effective in
    # all-to-all), one 400 Gb/s NIC per GPU (50 GB/s, ~44 effective), HBM3 3.35 TB/s.
    "h100_8x": ClusterTopology(name="h100_8x"),
    # 8x H200 141 GB per host: same NVLink and NICs, HBM3e 4.8 TB/s.
    "h200_8x": ClusterTopology(
        name="h200_8x", device_memory_bytes=141 * 10**9, lookup_bw=1.9e12, dense_flops=2.2e14
    ),
    # This project's CPU machine: gloo over loopback, one host. Fitted by
    # bench/planner_calibration.py (see bench/RESULTS.md, "Group-size advisor calibration").
    "cpu_gloo": ClusterTopology(
        name="cpu_gloo",
        ranks_per_host=1024,
        compute_device="cpu",
        device_memory_bytes=4 * GiB,
        reserved_fraction=0.25,
        intra_host_bw=0.208e9,
        intra_host_latency_s=640e-6,
        inter_host_bw=0.208e9,
        inter_host_latency_s=640e-6,
        lookup_bw=0.633e9,
        dense_flops=2.0e9,
        step_overhead_s=40.3e-3,
        sync_overhead_s=20.2e-3,
        allreduce_latency="ring",
    ),
}


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
        try:
            with open(name_or_path) as f:
                data = yaml.safe_load(f) or {}
        except OSError as error:
            raise ConfigError(f"--topology {name_or_path!r}: {error}") from None
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
