"""``sparse2d.ft.refusals``: the sync options fault tolerance refuses, each with its reason."""

from __future__ import annotations

import dataclasses

from sparse2d.ft.refusals import REASONS, option_refusals
from sparse2d.sync.options import SyncOptions


def test_defaults_are_accepted_and_each_refused_option_names_its_reason() -> None:
    assert option_refusals(SyncOptions(), fully_sharded=False) == []
    cases = {
        "sync.overlap": {"overlap": True},
        "sync.delayed_optimizer_state": {"delayed_optimizer_state": True},
        "sync.include_optimizer_state": {"include_optimizer_state": False},
    }
    for key, change in cases.items():
        options = dataclasses.replace(SyncOptions(), **change)
        assert [(k, why) for k, _, why in option_refusals(options, False)] == [(key, REASONS[key])]
    refused = option_refusals(SyncOptions(), fully_sharded=True)
    assert refused == [("sharding_strategy", "fully_sharded", REASONS["sharding_strategy"])]
