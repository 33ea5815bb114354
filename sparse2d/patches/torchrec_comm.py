"""TorchRec keeps ONE pair of 2D intra/cross-node groups per process.

Upstream: torchrec/distributed/comm.py:292 (``intra_and_cross_node_pg_2D`` creates the
TWRW/grid groups while the module globals ``_INTRA_PG_2D``/``_CROSS_PG_2D`` are None, then
returns that pair for every later call).
Issue: none found (searched: intra_and_cross_node_pg_2D cached groups, second DMPCollection;
https://github.com/meta-pytorch/torchrec/pull/4726 changes the same function, not the cache).
Without it: a second 2D model in one process with another layout (replica layout, group size,
node group size) runs its TWRW/grid all-to-alls over the FIRST model's ranks, silently wrong;
and after ``close()`` a later model gets the destroyed pair ("group is not registered").
Probe: ``needed()`` checks that ``torchrec.distributed.comm`` still has the two module-level
cache globals (a behavioural run needs a 2D process group: too dear for a probe).
Fix: one pair per (sharding group, node group size, inter-host flag), created while that model
is built; ``forget_destroyed_groups()`` (called by ``sparse2d.core.resources`` when a model's groups
are destroyed) drops the pairs of closed models.
Regression tests: ``tests/test_core_collection.py`` (two 2D layouts in one process),
``tests/test_patches_torchrec_comm.py`` (a second L = world TWRW model after ``close()``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sparse2d.patches._base import Patch, is_patched, mark

_SITES = (
    "torchrec.distributed.comm:intra_and_cross_node_pg_2D",
    "torchrec.distributed.sharding.grid_sharding:intra_and_cross_node_pg_2D",
    "torchrec.distributed.sharding.twrw_sharding:intra_and_cross_node_pg_2D",
)


def _groups_2d_per_layout(original: Callable[..., Any], comm: Any) -> Callable[..., Any]:
    made: dict[tuple[Any, ...], tuple[Any, Any]] = {}

    def groups(env: Any, device: Any = None) -> Any:
        if device is not None and device.type == "meta":
            return original(env, device)
        key = (
            env.sharding_pg,
            env.node_group_size,
            getattr(env, "use_inter_host_allreduce", False),
        )
        comm._INTRA_PG_2D, comm._CROSS_PG_2D = made.get(key, (None, None))
        made[key] = original(env, device)
        return made[key]

    def forget_destroyed() -> None:
        """Drop the groups of closed models: a reference kept here keeps their threads. An
        entry goes when its key group *or* its own pair is gone: with ``L`` = world the key
        is the job's group, which outlives the model, and a later model of that layout
        would otherwise get the closed model's destroyed pair ("group is not registered")."""
        for key in [
            k
            for k, pair in made.items()
            if not _registered(k[0]) or not all(_registered(g) for g in pair if g is not None)
        ]:
            del made[key]
        for name in ("_INTRA_PG_2D", "_CROSS_PG_2D"):
            group = getattr(comm, name)
            if group is not None and not _registered(group):
                setattr(comm, name, None)

    groups.forget_destroyed = forget_destroyed  # type: ignore[attr-defined]
    return mark(groups, original)


def _registered(group: Any) -> bool:
    from torch.distributed import distributed_c10d

    return group in distributed_c10d._world.pg_map


def forget_destroyed_groups() -> None:
    """Called after a model's groups are destroyed (``sparse2d.core.resources``)."""
    from torchrec.distributed import comm

    forget = getattr(comm.intra_and_cross_node_pg_2D, "forget_destroyed", None)
    if forget is not None:
        forget()


def needed() -> bool:
    """Whether TorchRec still caches one pair of 2D intra/cross-node groups per process."""
    from torchrec.distributed import comm

    return hasattr(comm, "_INTRA_PG_2D") and hasattr(comm, "_CROSS_PG_2D")


def apply() -> None:
    """Key the 2D groups by layout in ``comm`` and in the two modules that imported the
    function by name (idempotent)."""
    from torchrec.distributed import comm
    from torchrec.distributed.sharding import grid_sharding, twrw_sharding

    current = comm.intra_and_cross_node_pg_2D
    if not is_patched(current) and needed():
        fixed = _groups_2d_per_layout(current, comm)
        for module in (comm, grid_sharding, twrw_sharding):
            module.intra_and_cross_node_pg_2D = fixed  # type: ignore[attr-defined]


PATCHES = (
    Patch(
        name="torchrec_comm",
        upstream="torchrec/distributed/comm.py:292",
        issue="none found; nearest: https://github.com/meta-pytorch/torchrec/pull/4726 (same function, pod size)",
        breaks="a second 2D layout in one process reuses the first one's TWRW/grid groups",
        probe="comm still has the module-level _INTRA_PG_2D/_CROSS_PG_2D cache",
        needed=needed,
        apply=apply,
        sites=_SITES,
    ),
)
