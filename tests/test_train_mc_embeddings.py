"""The trainer's ``model.managed_collision`` option (MCH in front of the DLRM tables)."""

from __future__ import annotations

import pytest
import torch
from torchrec import EmbeddingBagCollection
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from sparse2d.errors import ConfigError, KeyValueError
from sparse2d.train.config import load_config
from sparse2d.train.config.model import ManagedCollisionConfig
from sparse2d.train.mc_embeddings import ManagedEmbeddingBags, managed
from tests import trainer_world

TINY = "configs/tiny_cpu.yaml"
ON = "model.managed_collision.enabled=true"


def test_data_draws_raw_ids_from_a_space_ten_times_the_table() -> None:
    cfg = load_config(TINY, [ON])
    assert [t.rows * 10 for t in cfg.model.specs()] == [t.rows for t in cfg.model.data_specs()]
    assert load_config(TINY, []).model.data_specs() == load_config(TINY, []).model.specs()


def test_checkpoints_with_managed_collision_save_at_eviction_rounds() -> None:
    """Checkpoints work with MC tables; with MCH they fall on eviction rounds (the ids seen
    since the last round are not saved)."""
    assert load_config(TINY, [ON, "checkpoint.every=10"]).checkpoint.every == 10
    every = "model.managed_collision.eviction_interval=4"
    assert load_config(TINY, [ON, every, "checkpoint.every=8"]).checkpoint.every == 8
    with pytest.raises(
        KeyValueError, match="multiple of model.managed_collision.eviction_interval=4"
    ):
        load_config(TINY, [ON, every, "checkpoint.every=10"])
    zch = "model.managed_collision.kind=zch"
    assert load_config(TINY, [ON, zch, every, "checkpoint.every=10"]).checkpoint.every == 10


def test_wrapper_gives_dlrm_an_ebc_face() -> None:
    configs = [EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=8, feature_names=["f"])]
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("cpu"))
    wrapped = managed(ebc, ManagedCollisionConfig(enabled=True), buckets=4)
    assert isinstance(wrapped, ManagedEmbeddingBags)
    assert wrapped.embedding_bag_configs() == configs and wrapped.tables is ebc
    with pytest.raises(ValueError, match="not a multiple of 3"):
        managed(ebc, ManagedCollisionConfig(enabled=True), buckets=3)


def test_trainer_runs_2d_with_managed_collision(tmp_path, world4) -> None:
    """Trains at L=2 saving checkpoints with identity tables, then resumes at L=4 (each MCH
    shard rebuilt by id) and trains on."""
    common = (
        ON,
        "train.log_every=10",
        "train.eval_every=0",
        "train.eval_batches=2",
        f"run_dir={tmp_path}",
        "checkpoint.every=10",
        "train.resume=auto",
    )
    summary, _ = trainer_world.train(world4, *common, "train.steps=20")
    assert summary["num_replicas"] == 2 and summary["sync_bytes_per_step"] > 0
    assert summary["eval_auc"] > 0.6
    resumed, out = trainer_world.train(
        world4, *common, "train.steps=30", "parallel.sharding_group_size=4"
    )
    assert "[resume] " in out and out.split("[resume] ")[1].split("\n")[0].endswith("step 20")
    assert resumed["steps"] == 30 and resumed["num_replicas"] == 1
    assert resumed["eval_auc"] > 0.6


def test_kind_zch_puts_mp_zch_in_front_of_every_table() -> None:
    from torchrec.modules.hash_mc_modules import HashZchManagedCollisionModule

    cfg = load_config(
        TINY, [ON, "model.managed_collision.kind=zch", "model.managed_collision.max_probe=16"]
    )
    configs = [EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=8, feature_names=["f"])]
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("cpu"))
    wrapped = managed(ebc, cfg.model.managed_collision, buckets=4)
    mc = wrapped.mc_ebc._managed_collision_collection._managed_collision_modules["t"]
    assert isinstance(mc, HashZchManagedCollisionModule)
    assert mc.max_probe == 16 and mc._input_hash_size == 80 and mc._hash_zch_metadata is not None
    with pytest.raises(ConfigError, match="kind=.hash. must be one of .mch., .zch."):
        load_config(TINY, [ON, "model.managed_collision.kind=hash"])
