"""Finding managed-collision modules and refusing what sparse2d cannot sync (pure checks)."""

from __future__ import annotations

import pytest
import torch
from torchrec.modules.embedding_configs import EmbeddingConfig
from torchrec.modules.hash_mc_modules import HashZchManagedCollisionModule
from torchrec.modules.mc_modules import (
    ManagedCollisionCollection,
    MCHEvictionPolicy,
    MCHManagedCollisionModule,
)

from sparse2d.errors import ConfigError
from sparse2d.managed_collision.tables import (
    check_managed_collision,
    check_torchrec_mc_2d,
    mc_modules,
    policy_name,
)
from sparse2d.option_conflicts import check_collection
from sparse2d.sync.options import SyncOptions
from tests.mc_models import build_mc_model


def test_finds_every_mch_module_and_its_policy() -> None:
    for policy, expected in (("lfu", "lfu"), ("lru", "lru"), ("distance_lfu", "distance_lfu")):
        found = mc_modules(build_mc_model(policy=policy))
        assert sorted(found) == [
            "mc._managed_collision_collection.m0",
            "mc._managed_collision_collection.m1",
        ]
        assert all(policy_name(m)[0] == expected for m in found.values())  # type: ignore[arg-type]


def test_plain_model_has_no_mc_tables() -> None:
    from tests.models import MIXED_TABLES, build_model

    assert check_managed_collision(build_model(MIXED_TABLES)) == []
    # no tables: nothing for the managed-collision rules to refuse
    check_collection(SyncOptions(momentum_scaling=True), "DEFAULT", [], custom_all_reduce=True)


def _zch_collection(**options: object) -> ManagedCollisionCollection:
    config = EmbeddingConfig(name="h", embedding_dim=8, num_embeddings=16, feature_names=["f_h"])
    module = HashZchManagedCollisionModule(
        zch_size=16,
        device=torch.device("cpu"),
        total_num_buckets=4,
        input_hash_size=100,
        **options,  # type: ignore[arg-type]
    )
    return ManagedCollisionCollection(
        managed_collision_modules={"h": module}, embedding_configs=[config]
    )


def test_mp_zch_is_accepted_and_its_unsynced_options_refused_in_one_line() -> None:
    assert check_managed_collision(_zch_collection()) == ["h"]
    for options, words in (
        ({"opt_in_prob": 50, "percent_reserved_slots": 10}, "opt_in_prob=50"),
        ({"track_id_freq": True}, "runtime metadata"),
    ):
        with pytest.raises(ConfigError, match=f"HashZchManagedCollisionModule.*{words}") as error:
            check_managed_collision(_zch_collection(**options))
        assert "\n" not in str(error.value)


def test_unknown_eviction_policy_is_refused() -> None:
    class Fifo(MCHEvictionPolicy):  # a user's own policy: sparse2d cannot know its merge
        def __init__(self) -> None:
            super().__init__(metadata_info=[])

        metadata_info = []  # type: ignore[assignment]

        def record_history_metadata(self, *args: object) -> None: ...

        def coalesce_history_metadata(self, *args: object) -> dict:  # type: ignore[override]
            return {}

        def update_metadata_and_generate_eviction_scores(self, *args: object):  # type: ignore[override]
            raise NotImplementedError

    module = MCHManagedCollisionModule(
        zch_size=8, device=torch.device("cpu"), eviction_policy=Fifo(), eviction_interval=1
    )
    with pytest.raises(ConfigError, match="Fifo"):
        policy_name(module)


@pytest.mark.parametrize(
    "settings,word",
    [
        ({"sync_options": SyncOptions(momentum_scaling=True)}, "sync_options.momentum_scaling"),
        ({"custom_all_reduce": True}, "custom_all_reduce=True"),
        ({"strategy": "FULLY_SHARDED"}, "sharding_strategy='FULLY_SHARDED'"),
    ],
)
def test_combinations_refused(settings: dict, word: str) -> None:
    """What ``DMPCollection`` checks per context with the tables this module finds."""
    tables = check_managed_collision(build_mc_model())
    args = {"sync_options": SyncOptions(), "strategy": "DEFAULT", "custom_all_reduce": False}
    with pytest.raises(ConfigError, match=f"managed-collision tables=.*{word}"):
        check_collection(**(args | settings), managed_collision=tables)
    check_collection(**args, managed_collision=tables)  # alone the tables are fine


def test_torchrec_without_2d_mc_is_refused_with_the_version_to_install() -> None:
    """TorchRec 1.6 gathers MC table sizes over the whole world: a 2D build would fail inside
    TorchRec (seen on the GPU machine), so sparse2d names the version instead."""
    with pytest.raises(ConfigError, match=r"\(m0, m1\) need TorchRec >= 1\.7.*TorchRec 1\.6\.1"):
        check_torchrec_mc_2d(["m0", "m1"], "1.6.1")
    for version in ("1.7.0", "1.8.0+cpu", "1.9.2", "2026.11.20"):
        check_torchrec_mc_2d(["m0"], version)
    check_torchrec_mc_2d(["m0"])  # the installed TorchRec (1.8 / 1.9 in the Makefile's sets)
