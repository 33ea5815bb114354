"""``model.construction``: seconds per phase and the plan's source, on 2 real gloo ranks;
a second model with the same ``plan_store`` loads rank 0's stored plan on every rank."""

from __future__ import annotations

import pytest

from sparse2d.core.construction import PHASES, ConstructionReport
from tests.models import MIXED_TABLES, PooledModel, Table

TABLES = tuple(Table(t.name, t.rows, t.dim, "") for t in MIXED_TABLES)


def build_twice(store: str) -> list[dict]:
    from sparse2d import DMPCollection

    records = []
    for _ in range(2):
        model = DMPCollection(PooledModel(TABLES, device="meta"), 2, device="cpu", plan_store=store)
        records.append(model.construction.record())
        plan = model.group_plan
        model.close()
    return [*records, {t: s.ranks for t, s in plan.plan["ebc"].items()}]


def test_second_model_loads_the_stored_plan_on_every_rank(world2, tmp_path) -> None:
    results = world2.run(build_twice, str(tmp_path))
    for first, second, _ in results:
        assert (first["plan_cache"], second["plan_cache"]) == ("miss", "hit")
        assert second["plans"]["default"]["file"] == str(tmp_path / "plan_default_L2.json")
        assert all(first[f"{p}_s"] >= 0 for p in PHASES) and first["total_s"] > 0
    assert results[0][2] == results[1][2]  # rank 1 got rank 0's plan


def test_report_words() -> None:
    report = ConstructionReport()
    assert report.plan_cache == "none"
    report.note_plan("default", "hit")
    report.note_plan("EmbeddingCollection", "given")
    assert report.plan_cache == "hit"
    report.note_plan("EmbeddingCollection", "stale", "f.json", "tables: t0 removed")
    assert report.record()["plan_cache"] == "stale"
    with report.phase("shard"):
        pass
    assert report.seconds["shard"] >= 0


def test_bad_plan_store_is_refused_before_any_collective() -> None:
    from sparse2d.errors import ConfigError
    from sparse2d.planner.plan_store import as_plan_store

    with pytest.raises(ConfigError, match="plan_store=42 must be a directory"):
        as_plan_store(42)  # type: ignore[arg-type]
