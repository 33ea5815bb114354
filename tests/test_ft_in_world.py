"""Per-module group sizes under fault tolerance (``sparse2d.ft.in_world``).

2 torchft groups x world 2: the ``EmbeddingBagCollection`` at L=2 (= world, no in-world
replica) and the ``EmbeddingCollection`` at L=1 (2 replicas inside each world), a sync every
step, no failure. The reference is in-world 2D at world 4 with the same per-module sizes
(TorchRec's 2D semantics: EBC 2 replicas, EC 4) and the same sync option, trained on the same
rows (rank ``r`` of group ``g`` is in-world rank ``r * G + g``: the EBC's sharding groups are
``[g, g + G]``, which AdaGrad tells apart). One launch runs every variant in turn, each with
its own lighthouse and group store (``tests.ft_groups.fresh_store``):

- ``dense``: EXACT_SGD, the two stages as they are;
- ``sparse``: touched rows (the in-world replicas' touched rows shared before the quorum);
  the last quorum sync sends fewer rows than all;
- ``scaling``: row-wise AdaGrad with momentum scaling (``c = G x n`` for the EC's
  accumulators, ``G`` for the EBC's).

Every variant: weights and optimizer states equal in-world 2D per shard, every replica of a
shard (in-world and across groups) bit-identical, every step committed. Without the touched
rows' sharing or the in-world factor, ``sparse`` and ``scaling`` differ by 1e-3 and 6e-4.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.testing import assert_close

from sparse2d.ft.lighthouse import start_lighthouse
from tests.ft_groups import fresh_store, run_groups
from tests.models import dense_params, full_weights, load_full_weights, make_batch
from tests.test_core_contexts import ALL, SEQUENCE, build, per_module, tables_and_coverage, train

GROUPS, SIZE, STEPS = 2, 2, 4
VARIANTS = {  # sync options, fused optimizer
    "dense": ({"engine": "dense"}, "sgd"),
    "sparse": ({"engine": "sparse"}, "sgd"),
    "scaling": ({"momentum_scaling": True, "engine": "dense"}, "rowwise_adagrad"),
}


def _start(name: str, ebc_group: int, ec_group: int):
    from torchrec.optim import RowWiseAdagrad

    from sparse2d.sync.options import SyncOptions

    options, fused = VARIANTS[name]
    optimizer, lr = (torch.optim.SGD, 2.0) if fused == "sgd" else (RowWiseAdagrad, 0.05)
    unsharded = build()
    weights = {**full_weights(unsharded.pooled), **full_weights(unsharded.sequence)}
    model = per_module(
        ebc_group=ebc_group,
        ec_group=ec_group,
        plan=False,
        optimizer=optimizer,
        lr=lr,
        sync_options=SyncOptions(**options),
    )  # type: ignore[arg-type]
    load_full_weights(model, weights)
    return model


def _shards(model) -> dict[tuple, list[torch.Tensor]]:
    """Per local shard: its weight, then its fused optimizer states."""
    from sparse2d.sync.shards import flush_caches

    flush_caches(model.shard_states)
    return {
        (s.table, s.row_offset, s.col_offset): [t.clone() for t in (s.weight, *s.optimizer_states)]
        for s in model.shard_states
    }


def _ft_variants(group: int, lighthouses: dict[str, str]) -> dict:
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from sparse2d.ft import FaultTolerance, FTOptimizer, FTOptions

    out = {}
    for name in VARIANTS:
        model = _start(name, ebc_group=SIZE, ec_group=1)
        store = fresh_store()  # noqa: F841 (kept alive while the manager uses it)
        opt = torch.optim.SGD(
            [p for _, p in in_backward_optimizer_filter(model.named_parameters())], lr=0.1
        )
        options = FTOptions(
            replica_id=group,
            num_groups=GROUPS,
            min_replica_size=GROUPS,
            lighthouse=lighthouses[name],
            timeout_s=20,
            quorum_timeout_s=60,
        )
        ft = FaultTolerance(model, opt, options)
        wrapper = FTOptimizer(ft)
        while ft.step < STEPS:
            wrapper.zero_grad()
            rank = dist.get_rank() * GROUPS + group  # in-world rank of (group, rank): EBC
            kjt, x, target = make_batch(ALL, ft.position, rank)  # sharding groups [g, g + G]
            ((model(kjt, x) - target) ** 2).mean().backward()
            wrapper.step()
        tables, _ = tables_and_coverage(model)
        stats = getattr(ft.policy.engine, "stats", None)
        scaler = ft.policy.scaler
        out[name] = {
            "tables": tables,
            "dense": dense_params(model),
            "shards": _shards(model),
            "summary": ft.summary(),
            "stage1": len(ft.policy.in_world),
            "contexts": [(c.name, c.sharding_group_size, c.num_replicas) for c in model.contexts],
            "rows": None if stats is None else (stats.rows_synced, stats.rows_total),
            "within": None if scaler is None else sorted(set(scaler.within)),
        }
        ft.shutdown()
        model.close()
    return out


def _in_world_2d() -> dict:
    """The references: every variant at world 4, EBC L=2, EC L=1."""
    out = {}
    for name in VARIANTS:
        model = _start(name, ebc_group=SIZE, ec_group=1)
        start, _ = tables_and_coverage(model)
        train(model, sync=True)  # dense SGD lr 0.1, make_batch(ALL, step, rank), sync every step
        tables, _ = tables_and_coverage(model)
        moved = max(float((tables[n] - start[n]).abs().max()) for n in tables)
        out[name] = {
            "tables": tables,
            "dense": dense_params(model),
            "moved": moved,
            "shards": _shards(model),
        }
        model.close()
    return out


def _check_close(name: str, got: dict, ref: dict, where: str) -> None:
    """FT equals in-world 2D within 1e-5 (weights, dense parameters, optimizer states)."""
    bound = 1e-5
    for kind in ("tables", "dense"):
        for key, value in ref[kind].items():
            worst = float((got[kind][key] - value).abs().max())
            assert worst <= bound, f"{name} {where} {kind} {key}: {worst} > {bound}"
    for key, (weight, *states) in got["shards"].items():  # shards by key: layouts may differ
        values = ref["shards"][key]
        worst = float((weight - values[0]).abs().max())
        assert worst <= bound, f"{name} {where} shard {key}: {worst} > {bound}"
        rtol = 1e-5
        for a, b in zip(states, values[1:], strict=True):
            excess = ((a - b).abs() - 1e-6) / b.abs().clamp(min=1e-30)
            assert_close(
                a,
                b,
                atol=1e-6,
                rtol=rtol,
                msg=f"{name} {where} states {key}: {float(excess.max())} relative over 1e-6",
            )


def test_per_module_group_sizes_under_ft_equal_in_world_2d(world4) -> None:
    lighthouses = {name: start_lighthouse(min_replicas=GROUPS) for name in VARIANTS}
    try:
        addresses = {name: lh.address() for name, lh in lighthouses.items()}
        out = run_groups(GROUPS, SIZE, _ft_variants, addresses)
    finally:
        for lighthouse in lighthouses.values():
            lighthouse.shutdown()
    ref = world4.run(_in_world_2d)
    ec = {t.name for t in SEQUENCE}
    for name, (_, fused) in VARIANTS.items():
        assert ref[0][name]["moved"] > 1e-2, (name, ref[0][name]["moved"])
        holders: dict[tuple, list[list[torch.Tensor]]] = {}
        ref_shards = {k: v for rank in ref for k, v in rank[name]["shards"].items()}
        for (g, r), all_got in out.items():
            got = all_got[name]
            assert got["contexts"] == [("default", 2, 1), ("EmbeddingCollection", 1, 2)]
            assert got["stage1"] == 1
            summary = got["summary"]
            assert summary["committed_steps"] == STEPS and summary["failed_commits"] == 0, summary
            expected = {**ref[r * GROUPS + g][name], "shards": ref_shards}
            _check_close(name, got, expected, f"{g}/{r}")
            for key, values in got["shards"].items():
                assert len(values) == (1 if fused == "sgd" else 2), (name, key, len(values))
                holders.setdefault(key, []).append(values)
        assert sorted(holders) == sorted(ref_shards), name
        for key, copies in holders.items():  # every replica, in-world and across groups
            assert len(copies) == (GROUPS * SIZE if key[0] in ec else GROUPS), (key, len(copies))
            for copy in copies:
                assert all(torch.equal(a, b) for a, b in zip(copy, copies[0], strict=True)), (
                    name,
                    key,
                )
    for got in out.values():
        rows, total = got["sparse"]["rows"]
        assert 0 < rows < total, (rows, total)  # the last quorum sync: touched rows only
        assert got["scaling"]["within"] == [1, 2]  # EBC: c = G; EC: c = G x 2 in-world


def _mc_tables_in_a_replicated_module() -> str:
    """One rank: MC tables in a module with in-world replicas (L=1 of world 2) under FT."""
    from torchrec.distributed.types import DMPCollectionConfig, ShardingStrategy
    from torchrec.modules.mc_embedding_modules import ManagedCollisionEmbeddingCollection

    from sparse2d import DMPCollection
    from sparse2d.errors import ConfigError
    from sparse2d.ft import FaultTolerance, FTOptions
    from tests.mc_models import build_mc_model

    config = DMPCollectionConfig(
        module=ManagedCollisionEmbeddingCollection,
        plan=None,
        sharding_group_size=1,
        sharding_strategy=ShardingStrategy.PER_MODULE,
    )
    model = DMPCollection(
        build_mc_model(plain=True),
        2,
        device="cpu",
        submodule_configs=[config],
        sharding_strategy=ShardingStrategy.PER_MODULE,
    )
    # no lighthouse listens there: the refusal must come first, from local checks alone
    options = FTOptions(
        replica_id=0, num_groups=2, lighthouse="http://127.0.0.1:1", connect_timeout_s=1
    )
    try:
        FaultTolerance(model, torch.optim.SGD([torch.zeros(1, requires_grad=True)]), options)
        return "accepted"
    except ConfigError as error:
        return str(error)
    finally:
        model.close()


def test_mc_tables_in_a_module_with_in_world_replicas_are_refused_on_every_rank(world2) -> None:
    """The one refusal left for FT x per-module sizes (mathematical: a two-stage identity merge
    would count a world's holders of an id as one), raised on every rank before connecting."""
    for message in world2.run(_mc_tables_in_a_replicated_module):
        assert "fault tolerance with managed-collision tables in" in message, message
        assert "give that module L = world size" in message, message
