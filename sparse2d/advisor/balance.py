"""Per-rank balance of a live 2D model: expected lookup load and shard memory (stragglers).

The advisor predicts imbalance from a plan; this measures the plan actually built, from the
rank's own shards, so the trainer can print max/mean over ranks at start-up.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sparse2d.advisor.workload import TableLoad


def local_load(
    shards: Iterable[Any], tables: Sequence[TableLoad], group_size: int, batch_size_per_rank: int
) -> tuple[float, int]:
    """(lookup bytes per step, weight + optimizer state bytes) of this rank's shards.

    A shard of ``rows`` out of a table's ``R`` receives ``rows / R`` of the group's
    ``L * B * features * pooling_factor`` ids (ids are hashed over rows) and reads ``cols``
    values for each.
    """
    by_name = {t.name: t for t in tables}
    load, memory = 0.0, 0
    for s in shards:
        memory += s.weight.numel() * s.weight.element_size()
        memory += sum(t.numel() * t.element_size() for t in s.optimizer_states)
        t = by_name.get(s.table)
        if t is not None:
            ids = group_size * batch_size_per_rank * t.features * t.pooling_factor
            load += ids * s.rows / t.rows * s.cols * s.weight.element_size()
    return load, memory


def max_over_mean(values: Sequence[float]) -> float:
    """1.0 is perfect balance; the group waits for the max."""
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean else 1.0
