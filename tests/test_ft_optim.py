"""``sparse2d.ft.FTOptimizer``: fault-tolerant step boundaries as an optimizer wrapper, so
TorchRec's train pipelines drive fault-tolerant 2D unchanged.

Two torchft groups of two gloo ranks, an in-process lighthouse, EXACT_SGD, sync every step:
``TrainPipelineSparseDist`` / ``TrainPipelineSemiSync`` over ``FTOptimizer`` (quorum in
``zero_grad``, the pipeline's ``model.sync()`` into copies, vote and commit in ``step``) equal
TorchRec 1D DMP driven by the same pipeline, and the groups end bit-identical.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.distributed as dist
from torch.testing import assert_close

from sparse2d.ft.lighthouse import start_lighthouse
from tests.ft_groups import run_groups
from tests.models import (
    MIXED_TABLES,
    constraints_for,
    dense_params,
    full_weights,
    gather_tables,
    load_full_weights,
    make_batch,
    shard_1d,
)
from tests.test_ft_fault_tolerant_steps import GROUPS, SIZE, STEPS

SEMI_SYNC_START = 2
"""``TrainPipelineSemiSync``'s ``start_batch`` here (the trainer's is 0)."""


def _late(kind: str, step: int) -> bool:
    """The ``defer`` predicate a pipeline allows: every step of ``TrainPipelineSparseDist``;
    ``TrainPipelineSemiSync`` looks the next batch up after a warm-up batch's ``step()``."""
    return kind != "semi_sync" or step >= SEMI_SYNC_START


def _ft_pipeline_train(group: int, lighthouse: str, steps: int, kind: str, defer: bool) -> dict:
    """One group driven by TorchRec's pipeline with the fault-tolerant optimizer wrapper;
    the pipeline itself calls ``model.sync()`` (``dmp_collection_sync_interval_batches=1``).
    ``defer``: every vote but the last lands at the next forward (as in the trainer), from
    the first semi-sync batch on (a warm-up batch's step is followed by the next batch's
    lookup, which must read its commit)."""
    from torchrec.datasets.utils import Batch
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from sparse2d import DMPCollection
    from sparse2d.ft import FaultTolerance, FTOptimizer, FTOptions
    from tests.test_core_call_forms import DENSE_LR, PIPELINES, pipeline_model

    tables = MIXED_TABLES
    weights = full_weights(pipeline_model().model)
    model = DMPCollection(
        pipeline_model(), SIZE, device="cpu", constraints=constraints_for(tables), node_group_size=2
    )
    load_full_weights(model, weights)
    dense = torch.optim.SGD(
        [p for _, p in in_backward_optimizer_filter(model.named_parameters())], lr=DENSE_LR
    )
    options = FTOptions(
        replica_id=group,
        num_groups=GROUPS,
        min_replica_size=GROUPS,
        lighthouse=lighthouse,
        timeout_s=20,
        quorum_timeout_s=60,
    )
    ft = FaultTolerance(model, dense, options)
    ft.final_step = steps if defer else None  # the last vote lands in step()
    ft.start_step()  # join (and heal) before the pipeline's first prefetch
    extra = {"start_batch": SEMI_SYNC_START} if kind == "semi_sync" else {}
    wrapper = FTOptimizer(ft, defer=partial(_late, kind) if defer else None)
    pipeline = PIPELINES[kind](
        model, wrapper, torch.device("cpu"), dmp_collection_sync_interval_batches=1, **extra
    )

    def data():
        position = ft.position
        while True:
            kjt, x, target = make_batch(tables, position, group * SIZE + dist.get_rank())
            yield Batch(dense_features=x, sparse_features=kjt, labels=target)
            position += 1

    it, committed, pending = data(), [], []
    surface_landed = None
    while ft.step < steps:
        pipeline.progress(it)
        committed += ft.verdicts
        pending.append(ft.pending)
        ft.verdicts.clear()
        if ft.pending and surface_landed is None:  # a state dict shows committed values
            before = ft.committed
            model.state_dict()
            surface_landed = (ft.pending, ft.committed - before)
            committed += ft.verdicts
            ft.verdicts.clear()
    summary = ft.summary()
    ft.shutdown()
    return {
        "tables": gather_tables(model, tables, None),
        "dense": dense_params(model),
        "committed": committed,
        "summary": summary,
        "pending": pending,
        "surface_landed": surface_landed,
    }


def _pipeline_reference(steps: int, kind: str) -> dict:
    from sparse2d.patches import apply_all
    from tests.test_core_call_forms import batches, make_pipeline, pipeline_model, run_pipeline

    apply_all()  # semi-sync on CPU (DMPCollection applies it; this run has none)
    tables = MIXED_TABLES
    weights = full_weights(pipeline_model().model)
    model = shard_1d(pipeline_model(), tables)
    load_full_weights(model, weights)
    run_pipeline(make_pipeline(kind, model, None), batches(tables, steps))
    return {"tables": gather_tables(model, tables, None), "dense": dense_params(model)}


@pytest.mark.parametrize(
    ("kind", "defer"), [("sparse_dist", False), ("sparse_dist", True), ("semi_sync", True)]
)
def test_torchrec_pipeline_drives_ft_and_equals_1d_driven_by_it(world4, kind, defer) -> None:
    """TorchRec's pipeline, unchanged, over ``FTOptimizer``: quorum in ``zero_grad``, the
    pipeline's ``model.sync()`` averages into copies, ``step()`` votes and commits (with
    ``defer``: the vote lands at the next forward, the last in ``step()``). No failure,
    EXACT_SGD, sync every step: TorchRec 1D DMP driven by the same pipeline, within 1e-5."""
    lighthouse = start_lighthouse(min_replicas=GROUPS)
    try:
        args = (lighthouse.address(), STEPS, kind, defer)
        out = run_groups(GROUPS, SIZE, _ft_pipeline_train, *args)
    finally:
        lighthouse.shutdown()
    ref = world4.run(_pipeline_reference, STEPS, kind)[0]
    base = out[(0, 0)]
    for key, got in out.items():
        assert got["committed"] == [True] * STEPS and got["summary"]["failed_commits"] == 0, got
        # each vote but the first quorum's step and the last landed late, when deferred
        late = [defer and _late(kind, i) and i < STEPS - 1 for i in range(STEPS)]
        assert got["pending"] == late, (key, got["pending"])
        # model.state_dict() with a vote pending landed it (committed one step) first
        assert got["surface_landed"] == ((False, 1) if defer else None), (key, got)
        for name, table in ref["tables"].items():
            assert_close(got["tables"][name], table, atol=1e-5, rtol=1e-5, msg=f"{key} {name}")
            assert torch.equal(got["tables"][name], base["tables"][name]), (key, name)
        for name, p in ref["dense"].items():
            assert_close(got["dense"][name], p, atol=1e-5, rtol=1e-5, msg=f"{key} {name}")
            assert torch.equal(got["dense"][name], base["dense"][name]), (key, name)
