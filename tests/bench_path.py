"""Put ``bench/`` on ``sys.path`` (its scripts import ``bench_util`` as a sibling module).

Imported by the benchmark smoke tests at collection, before the harness worlds spawn,
so the spawned ranks inherit the path and can unpickle the benchmarks' rank functions.
"""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = str(Path(__file__).resolve().parent.parent / "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)
