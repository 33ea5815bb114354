"""bench/ddp_riding.py: the stored run that retired riding DDP's all-reduce renders with the
means and the ratio its JSON holds (the figures the docs quote)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import tests.bench_path  # noqa: F401  (bench/ on sys.path)

# isort: split
import ddp_riding

ROOT = Path(__file__).resolve().parent.parent
STORED = ROOT / "bench" / "results" / "ddp_riding.json"


def test_the_stored_run_renders_its_means_and_ratio_and_the_docs_quote_them() -> None:
    result = json.loads(STORED.read_text())
    text = ddp_riding.render(result)
    mean = {
        name: statistics.mean(r["samples_per_s"] for r in result["runs"] if r["setting"] == name)
        for name in (ddp_riding.RIDING, ddp_riding.AFTER)
    }
    ratio = mean[ddp_riding.RIDING] / mean[ddp_riding.AFTER]
    assert f"**{ratio:.3f}**" in text and ratio < 1.05  # the retirement's reason
    figures = (
        f"{mean[ddp_riding.RIDING]:,.0f} samples/s riding DDP against {mean[ddp_riding.AFTER]:,.0f}"
    )
    assert figures in " ".join((ROOT / "docs" / "sync_strategies.md").read_text().split())
