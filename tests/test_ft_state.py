"""``sparse2d.ft.state``: what a healing rank receives restores its peer's state exactly."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torchrec.optim import RowWiseAdagrad
from torchrec.optim.optimizers import in_backward_optimizer_filter

from tests.models import MIXED_TABLES, build_model, constraints_for, make_batch


def _step(model, opt, step: int) -> None:
    kjt, dense, target = make_batch(MIXED_TABLES, step, dist.get_rank())
    ((model(kjt, dense) - target) ** 2).mean().backward()
    opt.step()
    opt.zero_grad()


def _capture_restore_roundtrip() -> dict:
    from sparse2d import DMPCollection
    from sparse2d.ft import state

    model = DMPCollection(
        build_model(MIXED_TABLES, optimizer=RowWiseAdagrad, lr=0.05),
        dist.get_world_size(),
        device="cpu",
        constraints=constraints_for(MIXED_TABLES),
        node_group_size=2,
    )
    shards = model.shard_states
    opt = torch.optim.Adagrad(
        [p for _, p in in_backward_optimizer_filter(model.named_parameters())], lr=0.1
    )
    for step in range(2):
        _step(model, opt, step)
    before = state.digest(model, shards)
    snapshot = state.capture(model, shards, opt, {"position": 2})
    _step(model, opt, 2)  # the live buffers move on; the snapshot must not
    moved = state.digest(model, shards)
    nbytes = state.restore(model, shards, opt, snapshot)
    fp = state.fingerprint(model, shards, "cfg")
    out = {
        "before": before,
        "moved": moved,
        "after": state.digest(model, shards),
        "bytes": nbytes,
        "states": sum(len(s.optimizer_states) for s in shards),
        "fp": fp,
        "fp_other": state.fingerprint(model, shards, "another config"),
        "opt_steps": [float(v["step"]) for v in opt.state.values()],
    }
    model.close()  # the shared world2 goes on to other tests
    return out


def test_capture_is_a_copy_and_restore_brings_back_every_tensor(world2) -> None:
    for out in world2.run(_capture_restore_roundtrip):
        assert out["moved"] != out["before"]  # a step changed the live state...
        assert out["after"] == out["before"]  # ...and restore brought all of it back
        assert out["states"] > 0 and out["bytes"] > 0
        assert out["opt_steps"] and all(s == 2.0 for s in out["opt_steps"])  # dense optimizer too
        assert out["fp"] != out["fp_other"] and 0 < out["fp"] < 2**48
