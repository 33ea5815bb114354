"""The replica sync timed on its own (a barrier before it), and split into its parts.

``planner_holdout.py`` times the sync as the first collective after the backward, so a
fast rank's sync also holds its wait for the slowest rank. Here the wait is timed apart
(the barrier) and the sync alone after it, per rank, for one series at every ``L`` (steps
alternated as in the holdout harness). Inside the sync, timers wrapped around the dense
engine's payload build, the NaN/inf scan, the wait for the job-wide vote, starting the
transfer and landing it say which part the advisor's sync term misses (the advisor prices
an all-reduce, the vote and a fixed cost).

``--crossover SERIES...`` times each series' sync with every dense payload averaged in
place (after the vote) and with every payload copied (the vote beside the transfer): where
one overtakes the other is ``sparse2d.sync.engines.base.IN_PLACE_MIN_BYTES``.

Usage: ``PYTHONPATH=. .venv/bin/python bench/sync_alone.py [SERIES] [ROUNDS]`` (default
``rw_a2a_w4``, 8 rounds x 2 steps per L after a warm-up round), or
``bench/sync_alone.py --crossover [SERIES...]``.
"""

from __future__ import annotations

import collections
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from bench_util import spawn
from planner_holdout import FIT_SERIES, SERIES, Series

CROSSOVER_SERIES = ("fit_2000x2048_w4", "fit_rw_5000x512_w4", "fit_20000x256_w4")
"""Fit-set series whose payloads (2.1, 2.6 / 5.3, 10.6 / 21 MB per rank at L=2 / L=1) bracket
the in-place crossover on the gloo box."""

PARTS = ("payload", "scan", "vote_wait", "start", "land")
"""The sync's timed parts: build the payload, scan it for NaN/inf, wait for the job-wide
vote, start the all-reduce, wait for it and write the average back (``land``: a part waits
for the vote as it lands; that wait is counted as ``vote_wait`` only)."""


def _instrument(models: dict[int, Any], spent: dict[str, float]) -> None:
    """Time the sync's parts into ``spent`` (seconds, summed per sync) by wrapping the
    functions the sync policy calls; nothing else changes."""
    import sparse2d.sync.guard as guard
    import sparse2d.sync.policy as policy

    def timed(part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            begin = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[part] += time.perf_counter() - begin

        return run

    guard.all_finite = timed("scan", guard.all_finite)
    guard.Verdict.wait = timed("vote_wait", guard.Verdict.wait)
    policy.InWorldChannel.start = timed("start", policy.InWorldChannel.start)
    landing = policy.InFlight.land

    def land(part: Any) -> float:
        begin, voted = time.perf_counter(), spent["vote_wait"]
        try:
            return landing(part)
        finally:  # the vote's wait inside it is vote_wait's
            spent["land"] += time.perf_counter() - begin - (spent["vote_wait"] - voted)

    policy.InFlight.land = land
    for model in models.values():
        engine = model.sync_policy.engine
        engine.payload = timed("payload", engine.payload)


NEVER = 1 << 62
"""An ``IN_PLACE_MIN_BYTES`` no payload reaches: every payload copied."""


def _rank(series: Series, rounds: int, limits: tuple[int | None, ...]) -> list[Any]:
    """One rank of ``measure_settings`` (run by ``bench_util.spawn``): every rank's medians."""
    import torch.distributed as dist
    from planner_holdout import _batch, _build

    import sparse2d.sync.engines.base as engine
    from sparse2d.mesh import divisors

    shipped = engine.IN_PLACE_MIN_BYTES
    rank = dist.get_rank()
    models = {L: _build(series, L) for L in divisors(series.world)}
    spent: dict[str, float] = collections.defaultdict(float)
    _instrument(models, spent)
    times: dict[tuple[int | None, int], dict[str, list[float]]] = {
        (limit, L): collections.defaultdict(list) for limit in limits for L in models
    }
    step = 0
    for r in range(rounds + 1):  # round 0 warms up every L
        for (limit, L), into in times.items():  # settings and L alternate within a round
            engine.IN_PLACE_MIN_BYTES = shipped if limit is None else limit
            for _ in range(2):
                batch = _batch(series, step, rank)
                step += 1
                dist.barrier()
                begin = time.perf_counter()
                models[L](batch).values().square().mean().backward()
                backward = time.perf_counter()
                dist.barrier()
                waited = time.perf_counter()
                spent.clear()
                models[L].sync()
                end = time.perf_counter()
                if r:
                    into["fwdbwd"].append(backward - begin)
                    into["wait"].append(waited - backward)
                    into["sync"].append(end - waited)
                    for part in PARTS:
                        into[part].append(spent[part])
    mine = {
        key: {k: statistics.median(v) for k, v in parts.items()} for key, parts in times.items()
    }
    gathered: list[Any] = [None] * series.world
    dist.all_gather_object(gathered, mine)
    for model in models.values():
        model.close()
    return gathered


def measure_settings(
    series: Series, rounds: int, limits: tuple[int | None, ...]
) -> dict[int | None, dict[int, list[dict[str, float]]]]:
    """``{limit: {L: [per rank {"fwdbwd", "wait", "sync", *PARTS: median seconds}]}}``, each
    ``limit`` an ``IN_PLACE_MIN_BYTES`` (None: the shipped one), alternated in one world."""
    ranks = spawn(series.world, _rank, series, rounds, limits)
    return {
        limit: {L: [r[(limit, L)] for r in ranks] for (lim, L) in ranks[0] if lim == limit}
        for limit in limits
    }


def measure(series: Series, rounds: int) -> dict[int, list[dict[str, float]]]:
    """``{L: [per rank {"fwdbwd", "wait", "sync", *PARTS: median seconds}]}`` as shipped."""
    return measure_settings(series, rounds, (None,))[None]


def payload_mb(series: Series, L: int) -> float:
    """MB one rank's dense sync sends at ``L``: its shards' weights and row-wise Adagrad
    state (one value per row), fp32; the harness balances its shards evenly."""
    per_group = sum(count * rows * (dim + 1) * 4 for count, rows, dim, _ in series.tables)
    return per_group / L / 1e6


def crossover(names: list[str], rounds: int = 8) -> list[str]:
    """Each series' sync alone (slowest rank's median) with payloads in place vs copied,
    alternated in one world; returns the printed lines."""
    lines = ["series, L, payload MB: sync ms in place / copied (slowest rank's median)"]
    print(lines[0])
    for name in names:
        series = next(s for s in SERIES + FIT_SERIES if s.name == name)
        timed = measure_settings(series, rounds, (0, NEVER))
        for L in timed[NEVER]:
            if L == series.world:
                continue
            place, copied = (max(r["sync"] for r in timed[k][L]) * 1e3 for k in (0, NEVER))
            faster = "in place" if place < copied else "copied"
            lines.append(
                f"  {name} L={L} {payload_mb(series, L):.2f} MB: {place:.1f} / "
                f"{copied:.1f} ({faster} faster)"
            )
            print(lines[-1])
    return lines


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--crossover":
        crossover(argv[1:] or list(CROSSOVER_SERIES), 8)
        return 0
    name = argv[0] if argv else "rw_a2a_w4"
    rounds = int(argv[1]) if len(argv) > 1 else 8
    series = next(s for s in SERIES + FIT_SERIES if s.name == name)
    keys = ("fwdbwd", "wait", "sync", *PARTS)
    print(f"{name}: per-rank medians, ms, mean over ranks [min-max]")
    for L, ranks in measure(series, rounds).items():
        cells = []
        for key in keys:
            values = [r[key] * 1e3 for r in ranks]
            cells.append(
                f"{key} {statistics.mean(values):.1f} [{min(values):.1f}-{max(values):.1f}]"
            )
        print(f"  L={L}: " + ", ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
