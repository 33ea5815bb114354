"""Per-module group sizes under fault tolerance (``sparse2d.ft.in_world``).

2 torchft groups x world 2: the ``EmbeddingBagCollection`` at L=2 (= world, no in-world
replica) and the ``EmbeddingCollection`` at L=1 (2 replicas inside each world), EXACT_SGD,
a sync every step, no failure. The reference is in-world 2D at world 4 with the same
per-module sizes (TorchRec's 2D semantics: EBC 2 replicas, EC 4), trained on the same rows.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.testing import assert_close

from sparse2d.ft.lighthouse import start_lighthouse
from tests.ft_groups import run_groups
from tests.models import dense_params, full_weights, load_full_weights, make_batch
from tests.test_contexts import ALL, SEQUENCE, build, per_module, tables_and_coverage, train

GROUPS, SIZE, STEPS = 2, 2, 4


def _start(ebc_group: int, ec_group: int):
    unsharded = build()
    weights = {**full_weights(unsharded.pooled), **full_weights(unsharded.sequence)}
    model = per_module(ebc_group=ebc_group, ec_group=ec_group, plan=False)
    load_full_weights(model, weights)
    return model


def _shards(model) -> dict[tuple, torch.Tensor]:
    from sparse2d.sync.shards import flush_caches

    flush_caches(model.shard_states)
    return {(s.table, s.row_offset, s.col_offset): s.weight.clone() for s in model.shard_states}


def _ft_per_module(group: int, lighthouse: str) -> dict:
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from sparse2d.ft import FaultTolerance, FTOptimizer, FTOptions

    model = _start(ebc_group=SIZE, ec_group=1)
    opt = torch.optim.SGD(
        [p for _, p in in_backward_optimizer_filter(model.named_parameters())], lr=0.1
    )
    options = FTOptions(replica_id=group, num_groups=GROUPS, min_replica_size=GROUPS,
                        lighthouse=lighthouse, timeout_s=20, quorum_timeout_s=60)  # fmt: skip
    ft = FaultTolerance(model, opt, options)
    wrapper = FTOptimizer(ft)
    while ft.step < STEPS:
        wrapper.zero_grad()
        kjt, x, target = make_batch(ALL, ft.position, group * SIZE + dist.get_rank())
        ((model(kjt, x) - target) ** 2).mean().backward()
        wrapper.step()
    tables, _ = tables_and_coverage(model)
    out = {
        "tables": tables, "dense": dense_params(model), "shards": _shards(model),
        "summary": ft.summary(), "stage1": len(ft.policy.in_world),
        "contexts": [(c.name, c.sharding_group_size, c.num_replicas) for c in model.contexts],
    }  # fmt: skip
    ft.shutdown()
    return out


def _in_world_2d() -> dict:
    """The reference, then (world 4, EBC L=4, EC L=1) the two-stage refusals."""
    from sparse2d import ConfigError
    from sparse2d.ft.in_world import in_world_policies
    from sparse2d.sync.options import SyncOptions

    model = _start(ebc_group=SIZE, ec_group=1)
    start, _ = tables_and_coverage(model)
    train(model, sync=True)  # dense SGD lr 0.1, make_batch(ALL, step, rank), sync every step
    tables, _ = tables_and_coverage(model)
    moved = max(float((tables[n] - start[n]).abs().max()) for n in tables)
    out = {"tables": tables, "dense": dense_params(model), "moved": moved, "refused": []}
    model.close()
    model = _start(ebc_group=4, ec_group=1)
    for options in ({"engine": "sparse"}, {"momentum_scaling": True}, {"compression": "bf16"}):
        try:
            in_world_policies(model, SyncOptions(**options))  # type: ignore[arg-type]
            out["refused"].append("not refused")
        except ConfigError as error:
            out["refused"].append(str(error))
    model.close()
    return out


def test_per_module_group_sizes_under_ft_equal_in_world_2d(world4) -> None:
    lighthouse = start_lighthouse(min_replicas=GROUPS)
    try:
        out = run_groups(GROUPS, SIZE, _ft_per_module, lighthouse.address())
    finally:
        lighthouse.shutdown()
    ref = world4.run(_in_world_2d)
    assert ref[0]["moved"] > 1e-2, ref[0]["moved"]
    for (g, r), got in out.items():
        assert got["contexts"] == [("default", 2, 1), ("EmbeddingCollection", 1, 2)]
        assert got["stage1"] == 1
        summary = got["summary"]
        assert summary["committed_steps"] == STEPS and summary["failed_commits"] == 0, summary
        for name, table in ref[0]["tables"].items():
            assert_close(got["tables"][name], table, atol=1e-5, rtol=1e-5, msg=f"{g}/{r} {name}")
        for name, p in ref[0]["dense"].items():
            assert_close(got["dense"][name], p, atol=1e-5, rtol=1e-5, msg=f"{g}/{r} {name}")
    holders: dict[tuple, list[torch.Tensor]] = {}
    for got in out.values():
        for key, weight in got["shards"].items():
            holders.setdefault(key, []).append(weight)
    ec = {t.name for t in SEQUENCE}
    for key, copies in holders.items():  # every replica, in-world and across groups
        assert len(copies) == (GROUPS * SIZE if key[0] in ec else GROUPS), (key, len(copies))
        assert all(torch.equal(c, copies[0]) for c in copies), key
    for text in ref[0]["refused"]:
        assert "per-module group sizes (EmbeddingCollection has replicas inside" in text, text
    assert [t.split(" sync ")[1].split(":")[0] for t in ref[0]["refused"]] == [
        "engine='sparse'", "momentum_scaling", "compression='bf16'"
    ]  # fmt: skip
