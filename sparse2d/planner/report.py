"""Render the advisor's answer: a table over ``L`` for people, one JSON object for tools."""

from __future__ import annotations

import json

from sparse2d.planner.search import Advice
from sparse2d.planner.topology import GiB

_HEADER = (
    f"{'L':>6} {'G':>5} {'mem/rank':>10} {'a2a':>9} {'sync':>9} {'compute':>9} "
    f"{'imbal':>6} {'step':>9}  fits"
)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}ms"


def format_table(advice: Advice) -> str:
    """The table over every ``L`` and the recommendation with its reason."""
    lines = [
        f"sharding group size advisor: world {advice.world_size}, topology {advice.topology}",
        _HEADER,
    ]
    for c in advice.candidates:
        mark = "  <- recommended" if c.sharding_group_size == advice.recommended else ""
        lines.append(
            f"{c.sharding_group_size:>6} {c.num_replicas:>5} "
            f"{c.memory_per_rank_bytes / GiB:>7.2f}GiB {_ms(c.a2a_s):>9} {_ms(c.sync_s):>9} "
            f"{_ms(c.compute_s):>9} {c.imbalance:>6.2f} {_ms(c.step_s):>9}  "
            f"{'yes' if c.fits else 'NO'}{mark}"
        )
    if advice.recommended is not None:
        lines.append(f"recommended: sharding_group_size={advice.recommended}  ({advice.reason})")
    return "\n".join(lines)


def to_json(advice: Advice) -> str:
    """One JSON object: world size, recommendation, reason and every candidate."""
    return json.dumps(
        {
            "world_size": advice.world_size,
            "recommended": advice.recommended,
            "reason": advice.reason,
            "candidates": [c.as_json() for c in advice.candidates],
        }
    )
