"""Rank layout of the 2D mesh and the process groups built from it.

A world of ``T`` ranks is split into ``G = T / L`` sharding groups of ``L`` ranks.
``rank_layout`` is pure (no process group) so planners, advisors and tests can
reason about placements offline; ``build_mesh`` turns the same layout into a
``DeviceMesh`` with dims ``("replicate", "shard")`` whose two subgroups are the
sharding and replica process groups.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparse2d.errors import ConfigError

if TYPE_CHECKING:  # torch is imported lazily: rank_layout and the config checker need none of it
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

logger = logging.getLogger(__name__)

REPLICA_LAYOUTS: tuple[str, ...] = ("intra_host", "inter_host")


def validate_group_size(world_size: int, sharding_group_size: int) -> None:
    """Raise ``ConfigError`` unless ``sharding_group_size`` divides ``world_size``."""
    if not isinstance(sharding_group_size, int) or isinstance(sharding_group_size, bool):
        raise ConfigError(
            f"sharding_group_size must be an int, got {sharding_group_size!r} "
            f"({type(sharding_group_size).__name__}); pass a divisor of the world size {world_size}."
        )
    if sharding_group_size < 1 or sharding_group_size > world_size:
        raise ConfigError(
            f"sharding_group_size={sharding_group_size} is outside 1..{world_size} "
            f"(world_size={world_size}); choose one of {divisors(world_size)}."
        )
    if world_size % sharding_group_size != 0:
        raise ConfigError(
            f"world_size={world_size} is not divisible by sharding_group_size={sharding_group_size} "
            f"({world_size} % {sharding_group_size} = {world_size % sharding_group_size}); "
            f"choose one of {divisors(world_size)}."
        )


def validate_layout(replica_layout: str) -> None:
    if replica_layout not in REPLICA_LAYOUTS:
        raise ConfigError(
            f"replica_layout={replica_layout!r} is unknown; use one of {list(REPLICA_LAYOUTS)} "
            "('intra_host' keeps replicas of a shard on adjacent ranks, 'inter_host' makes "
            "sharding groups contiguous)."
        )


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def rank_layout(
    world_size: int, sharding_group_size: int, replica_layout: str = "intra_host"
) -> list[list[int]]:
    """Return the sharding groups as lists of global ranks (row ``g`` = group ``g``).

    ``intra_host``: group ``g`` is ``[g, g+G, g+2G, ...]`` so the ``G`` replicas of a
    shard are adjacent ranks (same host, fast all-reduce). ``inter_host``: group
    ``g`` is ``[g*L, ..., g*L+L-1]`` so lookups stay on a host and sync crosses hosts.
    """
    validate_group_size(world_size, sharding_group_size)
    validate_layout(replica_layout)
    num_groups = world_size // sharding_group_size
    if replica_layout == "intra_host":
        return [[g + num_groups * r for r in range(sharding_group_size)] for g in range(num_groups)]
    return [
        [g * sharding_group_size + r for r in range(sharding_group_size)] for g in range(num_groups)
    ]


def replica_groups(
    world_size: int, sharding_group_size: int, replica_layout: str = "intra_host"
) -> list[list[int]]:
    """Return the replica groups: ranks holding the same shard (columns of the layout)."""
    groups = rank_layout(world_size, sharding_group_size, replica_layout)
    return [list(column) for column in zip(*groups)]


@dataclass(frozen=True, slots=True)
class Mesh2D:
    """The 2D mesh seen from one rank."""

    device_mesh: DeviceMesh
    sharding_pg: dist.ProcessGroup
    replica_pg: dist.ProcessGroup
    sharding_group: list[int]
    """Global ranks of this rank's sharding group, in shard order."""
    replica_group: list[int]
    """Global ranks holding the same shards as this rank, in replica order."""
    group_index: int
    """Which sharding group (0..G-1) this rank belongs to."""


def build_mesh(
    world_size: int,
    sharding_group_size: int,
    replica_layout: str,
    device_type: str,
    rank: int,
) -> Mesh2D:
    """Create the ``("replicate", "shard")`` DeviceMesh; collective over the world."""
    from torch.distributed.device_mesh import DeviceMesh

    layout = rank_layout(world_size, sharding_group_size, replica_layout)
    mesh = DeviceMesh(device_type, layout, mesh_dim_names=("replicate", "shard"))
    group_index = next(g for g, ranks in enumerate(layout) if rank in ranks)
    position = layout[group_index].index(rank)
    replicas = [ranks[position] for ranks in layout]
    logger.debug(  # the construction logs its mesh step in one line (sparse2d.core.collection)
        "2D mesh %s: sharding group %s, replica group %s",
        replica_layout,
        layout[group_index],
        replicas,
    )
    return Mesh2D(
        device_mesh=mesh,
        sharding_pg=mesh.get_group("shard"),
        replica_pg=mesh.get_group("replicate"),
        sharding_group=layout[group_index],
        replica_group=replicas,
        group_index=group_index,
    )
