"""Pure checks for ``sharding_strategy`` (every rank, before any collective).

FULLY_SHARDED replaces the sync cadence and the averaging hook with a reduce-scatter
after every step, and slices FBGEMM's fused buffers in device/host memory: options that
no longer apply, and plans whose kernels are not the plain fused TBE, are refused here
with the combination named, so no rank reaches a collective with a bad setup.
"""

from __future__ import annotations

from torchrec.distributed.types import ShardingPlan, ShardingStrategy

from sparse2d.errors import ConfigError
from sparse2d.sync.policy import SyncOptions


def check_fully_sharded_options(
    strategy: ShardingStrategy, sync_options: SyncOptions | None
) -> None:
    """Refuse what FULLY_SHARDED replaces (pure: runs on every rank before any collective).

    A ``custom_all_reduce`` hook is kept, as TorchRec does: ``sync()`` hands it the full
    weights and optimizer states (see ``FullyShardedEmbeddings.run_hook``).
    """
    if strategy != ShardingStrategy.FULLY_SHARDED:
        return
    if sync_options is None:
        return
    default = SyncOptions()
    changed = [
        name
        for name in ("every", "engine", "overlap", "compression", "delayed_optimizer_state")
        + ("momentum_scaling", "include_optimizer_state")
        if getattr(sync_options, name) != getattr(default, name)
    ]
    if changed:
        raise ConfigError(
            f"sync_options {', '.join(f'{n}={getattr(sync_options, n)!r}' for n in changed)} "
            "do not apply with sharding_strategy=FULLY_SHARDED, which averages weights and "
            "optimizer state by a dense reduce-scatter after every step (no cadence, sparse "
            "engine, overlap, compression or state scaling). Drop them or use DEFAULT."
        )


def check_fully_sharded_plan(strategy: ShardingStrategy, plan: ShardingPlan) -> None:
    """FULLY_SHARDED slices the plain fused TBE's buffers: refuse UVM/caching/other kernels."""
    if strategy != ShardingStrategy.FULLY_SHARDED:
        return
    for path, module_plan in plan.plan.items():
        for table, sharding in getattr(module_plan, "items", lambda: [])():
            if sharding.compute_kernel != "fused":
                raise ConfigError(
                    f"sharding_strategy=FULLY_SHARDED needs compute kernel 'fused' (the fused "
                    f"TBE in device or CPU memory); the plan gives {path}.{table} "
                    f"{sharding.compute_kernel!r}. Constrain compute_kernels=['fused'] or use "
                    "sharding_strategy=DEFAULT."
                )
