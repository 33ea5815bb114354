"""The plan store on meta-device models with a Topology and no process group: a stored plan
is reused only for the setup it was made for; anything else replans (saying why) or, for
an explicit plan file, raises; a damaged file is refused naming it."""

from __future__ import annotations

import json
import logging

import pytest
from torchrec.distributed.types import ShardingPlan

from sparse2d.errors import StoredPlanError
from sparse2d.planner import PlanStore, plan_for_group
from sparse2d.planner.plan_codec import decode_plan, encode_plan
from sparse2d.planner.sharders import default_sharders
from tests.models import MIXED_TABLES, PooledModel, Table

TABLES = tuple(Table(t.name, t.rows, t.dim, "") for t in MIXED_TABLES)  # free to plan


def make(tables=TABLES, ranks: int = 2, store: PlanStore | None = None, batch: int = 8):
    """One context planned (or loaded) alone, as the dry run does (``pg=None``)."""
    return plan_for_group(
        PooledModel(tables, device="meta"),
        ranks,
        "cpu",
        default_sharders(),
        None,
        ranks,
        None,
        batch,
        store=store,
        paths=["ebc"],
    )


def shards_of(plan: ShardingPlan) -> dict:
    """Everything a plan says, as plain data (what sharding reads)."""
    return json.loads(json.dumps(encode_plan(plan)))


def test_codec_round_trips_every_field_of_a_plan() -> None:
    plan = make(ranks=4).plan
    again = decode_plan(json.loads(json.dumps(encode_plan(plan))))
    for table, sharding in plan.plan["ebc"].items():
        other = again.plan["ebc"][table]
        assert type(again.plan["ebc"]) is type(plan.plan["ebc"])
        assert (other.sharding_type, other.compute_kernel, other.ranks) == (
            sharding.sharding_type,
            sharding.compute_kernel,
            sharding.ranks,
        )
        assert other.sharding_spec == sharding.sharding_spec


def test_second_plan_loads_the_stored_one(tmp_path) -> None:
    store = PlanStore(tmp_path)
    first = make(store=store)
    assert first.cache == "miss" and first.file == str(tmp_path / "plan_default_L2.json")
    second = make(store=store)
    assert second.cache == "hit" and second.file == first.file
    assert shards_of(second.plan) == shards_of(first.plan)
    assert make(ranks=1, store=store).cache == "miss"  # another L: its own file


def test_changed_table_replans_and_says_why(tmp_path, caplog) -> None:
    store = PlanStore(tmp_path)
    make(store=store)
    bigger = (Table("t0", 400, 8, ""), *TABLES[1:])
    with caplog.at_level(logging.WARNING, logger="sparse2d.planner.group_plan"):
        replanned = make(bigger, store=store)
    assert replanned.cache == "stale"
    assert replanned.reason.startswith("tables: ebc.t0 [40,") and "-> [400," in replanned.reason
    (line,) = [r.getMessage() for r in caplog.records if r.name.startswith("sparse2d")]
    assert str(tmp_path / "plan_default_L2.json") in line and "ebc.t0" in line, line
    assert make(bigger, store=store).cache == "hit"  # the new plan replaced the old
    assert "batch_size 8 -> 16" in make(bigger, store=store, batch=16).reason


def test_another_torchrec_version_replans(tmp_path) -> None:
    store = PlanStore(tmp_path)
    file = make(store=store).file
    with open(file) as f:
        record = json.load(f)
    record["context"]["torchrec"] = "0.0.1"
    record["context_hash"] = "0" * 20
    with open(file, "w") as f:
        json.dump(record, f)
    assert 'torchrec "0.0.1" -> ' in make(store=store).reason


@pytest.mark.parametrize("damage", ["truncated", "edited", "not_json_object"])
def test_damaged_plan_is_refused_naming_the_file(tmp_path, damage: str) -> None:
    store = PlanStore(tmp_path)
    file = make(store=store).file
    text = open(file).read()
    if damage == "truncated":
        text = text[: len(text) // 2]
    elif damage == "edited":  # a hand edit the checksum catches
        text = text.replace("rank:1/cpu", "rank:0/cpu", 1)
        assert text != open(file).read()
    else:
        text = "[1, 2]"
    with open(file, "w") as f:
        f.write(text)
    with pytest.raises(StoredPlanError, match=rf"stored plan '{file}' is damaged .*delete it"):
        make(store=store)


def test_explicit_plan_file_must_match(tmp_path) -> None:
    file = make(store=PlanStore(tmp_path)).file
    assert make(store=PlanStore(file)).cache == "hit"
    with pytest.raises(
        StoredPlanError,
        match=r"another setup \(node_group_size 2 -> 4; sharding_group_size 2 -> 4\)",
    ):
        make(ranks=4, store=PlanStore(file))
    other = (Table("t9", 40, 8, ""), *TABLES[1:])
    with pytest.raises(StoredPlanError, match=r"ebc.t0 removed, ebc.t9 added"):
        make(other, store=PlanStore(file))
    with pytest.raises(StoredPlanError, match="does not exist"):
        make(store=PlanStore(tmp_path / "missing.json"))
