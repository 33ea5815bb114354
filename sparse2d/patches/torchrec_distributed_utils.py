"""TorchRec gives no global shape for a table-column-wise (TWCW) table.

Upstream: torchrec/distributed/utils.py:601 (``create_global_tensor_shape_stride_from_metadata``
has no ``TABLE_COLUMN_WISE`` branch and returns ``shape=None``; called from
``embeddingbag.py:1300`` and ``embedding.py:1025``, which imported it by name).
Issue: none found (searched: create_global_tensor_shape_stride_from_metadata,
TABLE_COLUMN_WISE DTensor shape).
Without it: 2D sharding outputs DTensors, and a rank of the group that holds no shard of a
TWCW table crashes in ``DTensor.from_local`` while the sharded module is built
(``ShardedEmbeddingBagCollection._initialize_torch_state``).
Probe: ``needed()`` calls the upstream function on a two-shard TWCW table and checks that it
still fails or returns no shape.
Fix: TWCW shards are column blocks of the full table, exactly like column-wise ones: rows of
the first shard, columns summed; every other sharding type goes to TorchRec.
Regression test: ``tests/test_core_collection.py`` (TWCW with ranks that hold no shard).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from sparse2d.patches._base import Patch, is_patched, mark, original_of

_SITES = (
    "torchrec.distributed.embeddingbag:create_global_tensor_shape_stride_from_metadata",
    "torchrec.distributed.embedding:create_global_tensor_shape_stride_from_metadata",
)


def _with_table_column_wise(original: Callable[..., Any]) -> Callable[..., Any]:
    from torchrec.distributed.types import ParameterSharding, ShardingType

    def shape_and_stride(
        parameter_sharding: ParameterSharding, devices_per_node: int | None = None
    ) -> tuple[torch.Size, tuple[int, int]]:
        if parameter_sharding.sharding_type != ShardingType.TABLE_COLUMN_WISE.value:
            return original(parameter_sharding, devices_per_node)
        shards = parameter_sharding.sharding_spec.shards  # type: ignore[union-attr]
        rows = shards[0].shard_sizes[0]
        cols = sum(shard.shard_sizes[1] for shard in shards)
        return torch.Size([rows, cols]), (cols, 1)

    return mark(shape_and_stride, original)


def twcw_shape_missing(function: Callable[..., Any]) -> bool:
    """Whether ``function`` returns no global shape for a table-column-wise table."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec
    from torchrec.distributed.types import ParameterSharding, ShardingType

    blocks = [ShardMetadata([0, c], [4, 2], f"rank:{r}/cpu") for r, c in ((0, 0), (1, 2))]
    sharding = ParameterSharding(
        sharding_type=ShardingType.TABLE_COLUMN_WISE.value,
        compute_kernel="fused",
        ranks=[0, 1],
        sharding_spec=EnumerableShardingSpec(blocks),
    )
    try:
        shape, _ = function(sharding, None)
    except Exception:  # any failure on TWCW is the bug being worked around
        return True
    return shape is None


def needed() -> bool:
    """Whether TorchRec's own function still has no TWCW shape."""
    from torchrec.distributed import utils

    return twcw_shape_missing(original_of(utils.create_global_tensor_shape_stride_from_metadata))


def apply() -> None:
    """Add the TWCW case where the sharded modules call the function (idempotent)."""
    import torchrec.distributed.embedding as trec_embedding
    import torchrec.distributed.embeddingbag as trec_embeddingbag

    if not needed():
        return
    for module in (trec_embeddingbag, trec_embedding):
        current = module.create_global_tensor_shape_stride_from_metadata
        if not is_patched(current):
            module.create_global_tensor_shape_stride_from_metadata = _with_table_column_wise(
                current
            )


PATCHES = (
    Patch(
        name="torchrec_distributed_utils",
        upstream="torchrec/distributed/utils.py:601",
        issue="none found",
        breaks="a rank holding no shard of a TWCW table crashes building the 2D DTensor",
        probe="the function called on a tiny TWCW sharding still returns shape None",
        needed=needed,
        apply=apply,
        sites=_SITES,
    ),
)
