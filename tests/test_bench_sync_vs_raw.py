"""One-iteration smoke test of bench/sync_vs_raw_bench.py (no timing asserted)."""

from __future__ import annotations

import argparse

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
from sync_vs_raw_bench import MB, _markdown, sync_vs_raw_rank


def test_sync_vs_raw_one_size(world4) -> None:
    r = world4.run(sync_vs_raw_rank, [1], 1, 4)[0]
    assert r["loopback_Bps"] > 0
    (size,) = r["sizes"]
    assert size["bytes"] == 1 * MB and size["raw_s"] > 0 and size["sync_s"] > 0, size
    assert size["bare_s"] > 0, size  # the same sync with the NaN/inf guard off
    args = argparse.Namespace(reps=1, loopback_mb=4, sizes=[1], machine="test")
    assert "| 1.0 |" in _markdown(r, args, 1.0)
