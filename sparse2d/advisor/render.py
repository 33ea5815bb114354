"""Render the advisor's answer: a table over ``L`` for people, one JSON object for tools,
and ``explain``: why another ``L`` loses to the recommended one, term by term."""

from __future__ import annotations

import json

from sparse2d.advisor.cost_model import Candidate
from sparse2d.advisor.search import Advice
from sparse2d.advisor.topology import byte_text
from sparse2d.errors import ConfigError

_HEADER = (
    f"{'L':>6} {'G':>5} {'mem/rank':>10} {'a2a':>9} {'sync':>9} {'compute':>9} "
    f"{'imbal':>6} {'step':>9}  fits  sync     sharding types"
)

_SHORT = {
    "table_wise": "TW",
    "column_wise": "CW",
    "table_column_wise": "TWCW",
    "row_wise": "RW",
    "table_row_wise": "TWRW",
    "grid_shard": "GRID",
    "data_parallel": "DP",
}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}ms"


def types_text(c: Candidate) -> str:
    """``TW:512 TWRW:64``: the chosen layout's sharding types and how many tables each."""
    return " ".join(f"{_SHORT.get(t, t)}:{n}" for t, n in c.sharding_types)


def format_table(advice: Advice) -> str:
    """The table over every ``L``, each candidate's terms, and the recommendation."""
    lines = [
        f"sharding group size advisor: world {advice.world_size}, topology {advice.topology}",
        _HEADER,
    ]
    layouts = len({c.replica_layout for c in advice.candidates}) > 1  # auto: both priced
    for c in advice.candidates:
        mark = "  <- recommended" if c.sharding_group_size == advice.recommended else ""
        lines.append(
            f"{c.sharding_group_size:>6} {c.num_replicas:>5} "
            f"{byte_text(c.memory_per_rank_bytes):>10} {_ms(c.a2a_s):>9} {_ms(c.sync_s):>9} "
            f"{_ms(c.compute_s):>9} {c.imbalance:>6.2f} {_ms(c.step_s):>9}  "
            f"{'yes' if c.fits else 'NO':<4}  {c.sync_kind:<8} {types_text(c)}"
            + (f" [{c.replica_layout}]" if layouts else "")
            + mark
        )
    lines.append("terms per step (ms): " + ", ".join(n for n, _ in advice.candidates[0].terms))
    for c in advice.candidates:
        values = " ".join(f"{v * 1e3:.2f}" for _, v in c.terms)
        lines.append(f"{c.sharding_group_size:>6}: {values}")
    if advice.recommended is not None:
        where = f" replica_layout={advice.recommended_layout}" if layouts else ""
        lines.append(
            f"recommended: sharding_group_size={advice.recommended}{where}  ({advice.reason})"
        )
        lines += sync_mode_lines(advice.candidate(advice.recommended))
    return "\n".join(lines)


def sync_mode_lines(c: Candidate) -> list[str]:
    """The replica sync as a burst and streamed (``SyncOptions.stream``) at candidate ``c``,
    per step, and which of the two these links favour."""
    modes = dict(c.sync_modes)
    if not modes:
        return []
    burst, streamed = modes["burst"], modes["streamed"]
    pick = "true" if streamed < burst else "false"
    return [
        f"sync per step at L={c.sharding_group_size}: burst {_ms(burst)}, streamed "
        f"{_ms(streamed)}: parallel.sync.stream={pick} is the cheaper on these links"
    ]


def explain(advice: Advice, group_size: int) -> str:
    """Why ``group_size`` loses to the recommendation (or wins): each term side by side,
    the differences largest first, and the layouts' sharding types."""
    if group_size not in {c.sharding_group_size for c in advice.candidates}:
        sizes = [c.sharding_group_size for c in advice.candidates]
        raise ConfigError(
            f"--explain {group_size}: not a candidate; use one of the candidates {sizes}."
        )
    other = advice.candidate(group_size)
    if advice.recommended is None:
        return (
            f"L={group_size} needs {byte_text(other.memory_per_rank_bytes, ' ')} per rank; no L "
            "fits memory (see the numbered fixes)."
        )
    best = advice.candidate(advice.recommended)
    lines = [
        f"L={group_size} ({types_text(other)}) vs recommended L={best.sharding_group_size} "
        f"({types_text(best)}):"
    ]
    if not other.fits:
        lines.append(
            f"  L={group_size} does not fit: {byte_text(other.memory_per_rank_bytes, ' ')} per rank "
            f"(most loaded rank, imbalance {other.memory_imbalance:.2f})."
        )
    names = list(dict.fromkeys([n for n, _ in other.terms] + [n for n, _ in best.terms]))
    a, b = dict(other.terms), dict(best.terms)
    rows = sorted(names, key=lambda n: -abs(a.get(n, 0.0) - b.get(n, 0.0)))
    for n in rows:
        x, y = a.get(n, 0.0), b.get(n, 0.0)
        lines.append(
            f"  {n:<16} {x * 1e3:>10.2f} ms vs {y * 1e3:>10.2f} ms  ({(x - y) * 1e3:+.2f})"
        )
    lines.append(
        f"  {'step':<16} {other.step_s * 1e3:>10.2f} ms vs {best.step_s * 1e3:>10.2f} ms  "
        f"({(other.step_s - best.step_s) * 1e3:+.2f}); imbalance {other.imbalance:.2f} vs "
        f"{best.imbalance:.2f}"
    )
    return "\n".join(lines)


def to_json(advice: Advice) -> str:
    """One JSON object: world size, recommendation, reason and every candidate."""
    return json.dumps(
        {
            "world_size": advice.world_size,
            "recommended": advice.recommended,
            "recommended_layout": advice.recommended_layout,
            "reason": advice.reason,
            "candidates": [c.as_json() for c in advice.candidates],
        }
    )
