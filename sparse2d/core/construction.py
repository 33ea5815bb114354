"""How a ``DMPCollection`` was built: seconds per phase and where its plan came from.

At thousands of ranks construction is minutes unless the plan is reused; the report
(``model.construction``) says which phase took the time and whether the plan was loaded
from the plan store (``plan_cache="hit"``). The trainer writes ``record()`` into the start
record of ``metrics.jsonl`` and into ``summary.json`` under ``"construction"``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

PHASES = ("plan", "mesh", "shard", "align")


@dataclass(slots=True)
class ConstructionReport:
    """Seconds per construction phase and, per sharding context, the plan's source."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    plans: dict[str, dict[str, Any]] = field(default_factory=dict)
    """``{context: {"cache": hit|miss|stale|given|none, "file": ..., "reason": ...}}``."""

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start

    def note_plan(
        self, context: str, cache: str, file: str | None = None, reason: str = ""
    ) -> None:
        self.plans[context] = {"cache": cache, "file": file, "reason": reason}

    @property
    def plan_cache(self) -> str:
        """One word for the whole model: ``hit`` when every planned context loaded its
        stored plan, ``given`` when every plan was passed in, else the first context's
        other answer (``miss``, ``stale``, ``none``)."""
        caches = [p["cache"] for p in self.plans.values()]
        if not caches:
            return "none"
        for word in ("stale", "miss", "none"):
            if word in caches:
                return word
        return "hit" if "hit" in caches else "given"

    def record(self) -> dict[str, Any]:
        """The JSON form: ``{"plan_s", "mesh_s", "shard_s", "align_s", "total_s",
        "plan_cache", "plans"}``."""
        out: dict[str, Any] = {f"{p}_s": round(self.seconds[p], 4) for p in PHASES}
        out["total_s"] = round(sum(self.seconds.values()), 4)
        out["plan_cache"] = self.plan_cache
        out["plans"] = self.plans
        return out
