"""Pure checks for ``sharding_strategy`` (every rank, before any collective).

FULLY_SHARDED replaces the sync cadence and the averaging hook with a reduce-scatter
after every step, and slices FBGEMM's fused buffers in device/host memory: plans whose
kernels are not the plain fused TBE are refused here, so no rank reaches a collective with
a bad setup. The sync options it replaces are ``sparse2d.option_conflicts``' rules; a
``custom_all_reduce`` hook is kept, as TorchRec does (``FullyShardedEmbeddings.run_hook``).
"""

from __future__ import annotations

from torchrec.distributed.types import ShardingPlan, ShardingStrategy

from sparse2d.errors import ConfigError


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
