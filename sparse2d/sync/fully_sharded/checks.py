"""Pure checks for ``sharding_strategy`` (every rank, before any collective).

FULLY_SHARDED replaces the sync cadence and the averaging hook with a reduce-scatter
after every step, and slices FBGEMM's fused buffers in device/host memory: options that
no longer apply, and plans whose kernels are not the plain fused TBE, are refused here
with the combination named, so no rank reaches a collective with a bad setup.
"""

from __future__ import annotations

from torchrec.distributed.types import ShardingPlan, ShardingStrategy

from sparse2d.errors import ConfigError
from sparse2d.sync.fully_sharded_rules import WHY, fully_sharded_conflicts
from sparse2d.sync.options import SyncOptions


def check_fully_sharded_options(
    strategy: ShardingStrategy, sync_options: SyncOptions | None
) -> None:
    """Refuse what FULLY_SHARDED replaces (pure: runs on every rank before any collective).

    The one place these refusals are written (the trainer's config calls it too). Every
    row is reduce-scattered, so ``engine`` may be ``dense`` or ``auto`` (which then has
    nothing to choose) but not ``sparse``; ``hide`` and the divergence metric have no
    separate sync to act on and are ignored. Optimizer state and ``check_finite`` cannot be
    turned off: the reduce-scatter overwrites the only copy each replica keeps (1/G at
    rest, no full local copy to fall back to), so unaveraged state would leave replicas
    disagreeing for good, and the finite vote before it is what keeps one replica's NaN/inf
    from reaching every replica's slice (``FullyShardedEmbeddings`` always runs it).

    A ``custom_all_reduce`` hook is kept, as TorchRec does: ``sync()`` hands it the full
    weights and optimizer states (see ``FullyShardedEmbeddings.run_hook``).
    """
    if strategy != ShardingStrategy.FULLY_SHARDED or sync_options is None:
        return
    changed = fully_sharded_conflicts(sync_options)
    if changed:
        raise ConfigError(
            f"sync_options {', '.join(changed)} do not apply with "
            f"sharding_strategy=FULLY_SHARDED: {WHY}. Drop them or use DEFAULT."
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
