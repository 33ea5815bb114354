"""Every other sync path with managed-collision tables: handled, or refused before any collective.

Handled: the touched-rows and auto engines, hidden sync, delayed
optimizer state (they apply to the plain tables; MC tables are merged by id, blocking, at
the same sync), the NaN/inf guard, repair_from_replicas, TorchRec's call form.
Both MCH and MP-ZCH (HashZch) tables. Refused (``ConfigError`` on every rank, nothing sent):
momentum scaling, custom all-reduce, FULLY_SHARDED (checkpoints: tests/test_checkpoint_mc_identities.py).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.harness import DistWorld
from tests.mc_models import build_mc_model, train_mc
from tests.models import replica_max_diff
from tests.test_managed_collision_sync import _mch_modules

PATHS = [
    {"engine": "sparse"},
    {"engine": "auto"},
    {"hide": True},
    {"delayed_optimizer_state": True},
]


def mc_max_diff(model: Any, policy: Any = None) -> float:
    """Largest difference of MC identity buffers and MC rows to replica-rank 0's copy
    (over ``policy``'s replica group; default the model's only policy)."""
    policy = policy or model.sync_policy
    pg = policy.replica_pg
    worst = torch.zeros((), dtype=torch.float64)
    tensors: list[torch.Tensor] = []
    for mc in _mch_modules(model).values():
        if hasattr(mc, "_hash_zch_identities"):  # MP-ZCH
            tensors += [mc._hash_zch_identities, mc._hash_zch_metadata]
        else:
            tensors += [mc._mch_sorted_raw_ids, mc._mch_remapped_ids_mapping, mc._mch_counts]
    tensors += [t for s in policy.mc.shards for t in (s.weight, *s.optimizer_states)]
    for tensor in tensors:
        ref = tensor.clone()
        dist.broadcast(ref, src=dist.get_global_rank(pg, 0), group=pg)
        worst = torch.maximum(worst, (tensor.double() - ref.double()).abs().max())
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return float(worst)


def check_path(options: dict[str, Any], kind: str = "mch") -> list[float]:
    from torchrec.optim import RowWiseAdagrad

    from sparse2d import DMPCollection
    from sparse2d.sync.options import SyncOptions

    model = DMPCollection(
        build_mc_model(optimizer=RowWiseAdagrad, lr=0.05, plain=True, kind=kind),
        2,
        device="cpu",
        sync_options=SyncOptions(every=2, **options),
    )
    diffs: list[float] = []

    def after(step: int) -> None:
        if model.maybe_sync(step) is not None:  # MC tables are merged blocking at the sync
            diffs.append(mc_max_diff(model))

    train_mc(model, 6, plain=True, after_step=after)
    model.sync()
    diffs.append(mc_max_diff(model))
    diffs.append(replica_max_diff(model, model.replica_pg))  # every table, plain ones too
    model.close()
    return diffs


@pytest.mark.parametrize("kind", ["mch", "zch"])
@pytest.mark.parametrize("options", PATHS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_paths_keep_mc_replicas_identical(
    world4: DistWorld, options: dict[str, Any], kind: str
) -> None:
    diffs = world4.run(check_path, options, kind)[0]
    assert len(diffs) >= 3 and all(d == 0.0 for d in diffs), diffs


def check_nan_guard() -> tuple[str, bool]:
    from sparse2d import DMPCollection, SyncError

    with DMPCollection(build_mc_model(plain=True), 2, device="cpu") as model:
        train_mc(model, 3, plain=True)
        ids = {n: mc._mch_sorted_raw_ids.clone() for n, mc in _mch_modules(model).items()}
        if dist.get_rank() == 3:
            model.sync_policy.mc.shards[0].weight[0, 0] = float("nan")
        try:
            model.sync()
        except SyncError as error:
            unchanged = all(
                torch.equal(ids[n], mc._mch_sorted_raw_ids) for n, mc in _mch_modules(model).items()
            )
            return str(error), unchanged
        return "", False


def test_nan_on_one_replica_refuses_before_merging(world4: DistWorld) -> None:
    results = world4.run(check_nan_guard)
    assert all(message and unchanged for message, unchanged in results), results
    assert all("rank" in message for message, _ in results)


def check_repair() -> tuple[float, float]:
    from sparse2d import DMPCollection

    model = DMPCollection(build_mc_model(plain=True), 2, device="cpu")
    train_mc(model, 3, plain=True)
    model.sync()
    if dist.get_rank() == 1:  # rank 1 restarts: fresh identities and rows
        for mc in _mch_modules(model).values():
            mc._mch_sorted_raw_ids.fill_(torch.iinfo(torch.int64).max)
            mc._mch_counts.zero_()
        for shard in model.shard_states:
            shard.weight.normal_()
    broken = mc_max_diff(model)
    model.repair_from_replicas([1])
    repaired = mc_max_diff(model)
    model.close()
    return broken, repaired


def test_repair_from_replicas_restores_identities(world4: DistWorld) -> None:
    broken, repaired = world4.run(check_repair)[0]
    assert broken > 0 and repaired == 0.0


def check_torchrec_call() -> float:
    """TorchRec's positional call, default sharders, L=4 (one replica) and L=2."""
    from sparse2d import DMPCollection

    diffs = []
    for group_size in (4, 2):
        model = DMPCollection(
            build_mc_model(bagged=True), torch.device("cpu"), None, 4, group_size, None
        )
        train_mc(model, 3)
        model.sync()
        diffs.append(mc_max_diff(model))
        model.close()
    return max(diffs)


def test_torchrec_call_form_shards_and_trains(world4: DistWorld) -> None:
    assert world4.run(check_torchrec_call)[0] == 0.0


def check_refusals() -> list[str]:
    from torchrec.distributed.types import ShardingStrategy

    from sparse2d import DMPCollection
    from sparse2d.errors import ConfigError
    from sparse2d.sync.options import SyncOptions

    messages = []
    attempts = [
        {"sync_options": SyncOptions(momentum_scaling=True)},
        {"custom_all_reduce": lambda tensors: None},
        {"sharding_strategy": ShardingStrategy.FULLY_SHARDED},
    ]
    for kwargs in attempts:
        with pytest.raises(ConfigError) as error:
            DMPCollection(build_mc_model(), 2, device="cpu", **kwargs)
        messages.append(str(error.value))
    return messages


def test_unsupported_combinations_refused_before_any_collective(world4: DistWorld) -> None:
    messages = world4.run(check_refusals)[0]
    for text, word in zip(
        messages,
        ["momentum_scaling", "custom_all_reduce", "FULLY_SHARDED"],
        strict=True,
    ):
        assert word in text and "managed-collision" in text, text


def check_per_module_group_size() -> tuple[int, float, float]:
    """MC-EC in its own context (L=1: 4 replicas) beside a plain EBC (L=2)."""
    from torchrec.distributed.types import DMPCollectionConfig
    from torchrec.modules.mc_embedding_modules import ManagedCollisionEmbeddingCollection

    from sparse2d import DMPCollection

    config = DMPCollectionConfig(
        module=ManagedCollisionEmbeddingCollection, plan=None, sharding_group_size=1
    )
    model = DMPCollection(build_mc_model(plain=True), 2, device="cpu", submodule_configs=[config])
    train_mc(model, 4, plain=True)
    model.sync()
    mc_ctx = next(c for c in model.contexts if c.policy.mc is not None and c.policy.mc.tables)
    plain = next(c for c in model.contexts if c is not mc_ctx)
    result = (
        mc_ctx.num_replicas,
        mc_max_diff(model, mc_ctx.policy),
        replica_max_diff(model, plain.replica_pg, plain.shards),
    )
    model.close()
    return result


def test_per_module_group_sizes(world4: DistWorld) -> None:
    replicas, mc_diff, plain_diff = world4.run(check_per_module_group_size)[0]
    assert replicas == 4 and mc_diff == 0.0 and plain_diff == 0.0
