"""Managed-collision tables under fault tolerance: the quorum's groups merge identities by the
in-world 2D rules (``sparse2d.managed_collision`` over torchft's managed channel).

2 torchft groups x 2 gloo ranks against in-world 2D (world 4, L=2, 2 replicas), the same
MC model (MCH or MP-ZCH), rows, data and sync every step: every rank ends with the same identity tables
(ids, rows, metadata) and rows within 1e-5, and the groups end bit-identical.
"""

from __future__ import annotations

import zlib

import pytest
import torch
import torch.distributed as dist
from torch.testing import assert_close

from sparse2d.ft.lighthouse import start_lighthouse
from tests.ft_groups import run_groups
from tests.mc_models import build_mc_model, mc_batch

GROUPS, SIZE, STEPS = 2, 2, 6


def _set_rows(model) -> None:
    """The same rows on every layout: a function of (table, global row, column)."""
    with torch.no_grad():
        for s in model.shard_states:
            rows = torch.arange(s.row_offset, s.row_offset + s.weight.shape[0])[:, None]
            cols = torch.arange(s.col_offset, s.col_offset + s.weight.shape[1])[None, :]
            phase = zlib.crc32(s.table.encode()) % 97
            s.weight.copy_(0.1 * torch.sin(rows * 0.37 + cols * 1.3 + phase))


def _state(model, policy) -> dict:
    from sparse2d.managed_collision import mc_identity_buffers
    from sparse2d.sync.shards import flush_caches

    flush_caches(model.shard_states)
    return {
        "identities": [t.clone() for t in mc_identity_buffers(policy)],
        "rows": {s.table: s.weight.clone() for s in model.shard_states},
    }


def _dense_opt(model) -> torch.optim.Optimizer:
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    params = [p for _, p in in_backward_optimizer_filter(model.named_parameters())]
    return torch.optim.SGD(params, lr=0.05)


def _ft_mc(group: int, lighthouse: str, steps: int, kind: str) -> dict:
    from sparse2d import DMPCollection
    from sparse2d.ft import FaultTolerance, FTOptimizer, FTOptions

    model = DMPCollection(build_mc_model(kind=kind), SIZE, device="cpu")
    _set_rows(model)
    options = FTOptions(
        replica_id=group,
        num_groups=GROUPS,
        min_replica_size=GROUPS,
        lighthouse=lighthouse,
        timeout_s=20,
        quorum_timeout_s=60,
    )
    ft = FaultTolerance(model, _dense_opt(model), options)
    opt = FTOptimizer(ft)
    while ft.step < steps:
        opt.zero_grad()
        # in-world rank r * G + g is rank r of sharding group g (intra_host layout)
        kjt, dense, target = mc_batch(ft.position, dist.get_rank() * GROUPS + group)
        ((model(kjt, dense) - target) ** 2).mean().backward()
        opt.step()
    out = {**_state(model, ft.policy), "summary": ft.summary()}
    ft.shutdown()
    return out


def _in_world_mc(steps: int, kind: str) -> dict:
    from sparse2d import DMPCollection

    model = DMPCollection(build_mc_model(kind=kind), SIZE, device="cpu")
    _set_rows(model)
    opt = _dense_opt(model)
    for step in range(steps):
        kjt, dense, target = mc_batch(step, dist.get_rank())
        ((model(kjt, dense) - target) ** 2).mean().backward()
        opt.step()
        opt.zero_grad()
        model.sync()
    return _state(model, model.sync_policy)


@pytest.mark.parametrize("kind", ["mch", "zch"])
def test_identities_merge_across_groups_as_in_world_2d(world4, kind: str) -> None:
    """MCH (sparse2d's merge) and MP-ZCH (TorchRec's identity merge, rows averaged by id)."""
    lighthouse = start_lighthouse(min_replicas=GROUPS)
    try:
        out = run_groups(GROUPS, SIZE, _ft_mc, lighthouse.address(), STEPS, kind)
    finally:
        lighthouse.shutdown()
    ref = world4.run(_in_world_mc, STEPS, kind)
    for (g, r), got in out.items():
        assert got["summary"]["committed_steps"] == STEPS, got["summary"]
        expected = ref[r * GROUPS + g]
        for a, b in zip(got["identities"], expected["identities"], strict=True):
            assert torch.equal(a, b), (g, r)
        for name, rows in expected["rows"].items():
            assert_close(got["rows"][name], rows, atol=1e-5, rtol=1e-5, msg=f"{g}/{r} {name}")
        twin = out[(1 - g, r)]  # the same rank of the other group: bit-identical
        assert all(torch.equal(a, b) for a, b in zip(got["identities"], twin["identities"]))
        assert all(torch.equal(got["rows"][n], twin["rows"][n]) for n in got["rows"])
