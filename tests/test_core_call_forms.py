"""TorchRec users' code runs unchanged: pipelines sync our replicas, TorchRec's call works.

Mirrors ``sparse2d/core/call_forms.py`` (call parsing) and the TorchRec-facing side of
``sparse2d/core/collection.py``. References are TorchRec's own 1D ``DistributedModelParallel``
driven by the same TorchRec train pipeline.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torchrec.datasets.utils import Batch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DMPCollection as TorchRecDMPCollection
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.train_pipeline.train_pipelines import (
    TrainPipelineSemiSync,
    TrainPipelineSparseDist,
)
from torchrec.distributed.types import ShardingStrategy
from torchrec.optim.optimizers import in_backward_optimizer_filter

from sparse2d import DMPCollection
from sparse2d.core.call_forms import (
    TORCHREC_POSITIONAL,
    adapt_all_reduce,
    parse_call,
    resolve_layout,
)
from sparse2d.errors import ConfigError
from sparse2d.patches import apply_all
from sparse2d.sync.policy import SyncOptions
from tests.models import (
    MIXED_TABLES,
    PooledModel,
    Table,
    build_model,
    constraints_for,
    dense_params,
    full_weights,
    gather_tables,
    load_full_weights,
    make_batch,
    replica_max_diff,
    shard_1d,
)

BATCHES = 6
LR = 2.0  # large embedding steps, so that the 1e-5 comparison is meaningful
DENSE_LR = 0.1  # as tests.models.train: larger dense steps make MSE diverge
PIPELINES = {"sparse_dist": TrainPipelineSparseDist, "semi_sync": TrainPipelineSemiSync}
TORCHREC_TABLES = (Table("t0", 40, 8, "table_wise"), Table("t1", 48, 16, "column_wise"))


# ---- models and data the way TorchRec's pipelines want them -------------------------------
class PipelineModel(nn.Module):
    """``forward(batch) -> (loss, prediction)``, the contract of TorchRec's train pipelines."""

    def __init__(self, model: PooledModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        pred = self.model(batch.sparse_features, batch.dense_features)
        return ((pred - batch.labels) ** 2).mean(), pred.detach()


def batches(tables: tuple[Table, ...], count: int = BATCHES) -> list[Batch]:
    out = []
    for step in range(count):
        kjt, dense, target = make_batch(tables, step, dist.get_rank())
        out.append(Batch(dense_features=dense, sparse_features=kjt, labels=target))
    return out


def pipeline_model(tables: tuple[Table, ...] = MIXED_TABLES) -> PipelineModel:
    return PipelineModel(build_model(tables, lr=LR))


def make_pipeline(kind: str, model: nn.Module, interval: int | None):
    dense = torch.optim.SGD(
        [p for _, p in in_backward_optimizer_filter(model.named_parameters())], lr=DENSE_LR
    )
    extra = {"start_batch": 2} if kind == "semi_sync" else {}  # both phases of semi-sync
    return PIPELINES[kind](
        model, dense, torch.device("cpu"), dmp_collection_sync_interval_batches=interval, **extra
    )


def run_pipeline(pipeline, data: list[Batch], after=None) -> list[torch.Tensor]:
    it, outputs = iter(data), []
    for index in range(len(data)):
        outputs.append(pipeline.progress(it))
        if after is not None:
            after(index)
    return outputs


# ---- worker-side checks --------------------------------------------------------------------
def check_pipeline(kind: str, group: int, interval: int | None) -> dict:
    """2D and TorchRec 1D, each driven by the same TorchRec pipeline from identical weights."""
    apply_all()  # semi-sync on CPU; DMPCollection applies it too, the 1D run comes first
    tables = MIXED_TABLES
    weights = full_weights(pipeline_model().model)
    reference = shard_1d(pipeline_model(), tables)
    load_full_weights(reference, weights)
    ref_out = run_pipeline(make_pipeline(kind, reference, interval), batches(tables))
    model = DMPCollection(
        pipeline_model(), group, device="cpu", constraints=constraints_for(tables)
    )
    load_full_weights(model, weights)
    diffs: list[float] = []
    out = run_pipeline(
        make_pipeline(kind, model, interval),
        batches(tables),
        after=lambda _: diffs.append(replica_max_diff(model, model.replica_pg)),
    )
    expected = gather_tables(reference, tables, None)
    got = gather_tables(model, tables, model.sharding_pg)
    table_diff = max(float((got[n] - expected[n]).abs().max()) for n in expected)
    ref_dense, dense = dense_params(reference), dense_params(model)
    dense_diff = max(float((dense[n] - ref_dense[n]).abs().max()) for n in ref_dense)
    out_diff = max(float((a - b).abs().max()) for a, b in zip(out, ref_out, strict=True))
    moved = max(float((expected[n] - weights[n]).abs().max()) for n in weights)
    return {
        "diffs": diffs,
        "table": table_diff,
        "dense": dense_diff,
        "out": out_diff,
        "moved": moved,
        "replicas": model.num_replicas,
    }


def check_torchrec_script(inter_host: bool) -> dict:
    """A script written for TorchRec's DMPCollection; only the import differs."""
    tables, group = TORCHREC_TABLES, 2
    model = pipeline_model(tables)
    sharders = [EmbeddingBagCollectionSharder()]
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=group, compute_device="cpu", local_world_size=group),
        constraints=constraints_for(tables),
    )
    plan = planner.collective_plan(model, sharders, dist.group.WORLD)
    model = DMPCollection(
        module=model,
        device=torch.device("cpu"),
        plan=plan,
        world_size=dist.get_world_size(),
        sharding_group_size=group,
        global_pg=dist.group.WORLD,
        sharders=sharders,
        use_inter_host_allreduce=inter_host,
    )
    pipeline = make_pipeline("sparse_dist", model, 1)
    before = {n: t.clone() for n, t in gather_tables(model, tables, model.sharding_pg).items()}
    diffs: list[float] = []
    run_pipeline(
        pipeline, batches(tables), lambda _: diffs.append(replica_max_diff(model, model.replica_pg))
    )
    after = gather_tables(model, tables, model.sharding_pg)
    return {
        "sharding_group": model.sharding_group,
        "replica_group": model.replica_group,
        "is_torchrec": isinstance(model, TorchRecDMPCollection),
        "diffs": diffs,
        "moved": max(float((after[n] - before[n]).abs().max()) for n in after),
    }


def check_positional_torchrec_call(inter_host: bool) -> dict:
    """TorchRec's positional order; the default plan is made by sparse2d (plan=None)."""
    model = build_model(MIXED_TABLES)
    model = DMPCollection(
        model,
        torch.device("cpu"),
        None,
        dist.get_world_size(),
        2,
        dist.group.WORLD,
        ShardingStrategy.PER_MODULE,
        2,
        None,
        True,
        True,
        None,
        inter_host,
    )
    return {"sharding_group": model.sharding_group, "strategy": model.sharding_strategy}


def check_bad_call(kwargs: dict) -> None:
    DMPCollection(build_model(MIXED_TABLES), device="cpu", **kwargs)


def check_hook() -> dict:
    """TorchRec's ``hook(tensors)``, closing over the replica group, is called and averages."""
    model = DMPCollection(build_model(MIXED_TABLES), 2, device="cpu")
    pg, calls = model.replica_pg, []

    def average(tensors: list[torch.Tensor]) -> None:
        calls.append(len(tensors))
        for t in tensors:
            dist.all_reduce(t, group=pg)
            t.div_(dist.get_world_size(pg))

    model.set_all_reduce_hook(average)
    for shard in model.shard_states:  # make replicas differ, then sync through the hook
        shard.weight.add_(float(dist.get_rank()))
    model.sync()
    return {"calls": len(calls), "diff": replica_max_diff(model, model.replica_pg)}


# ---- tests ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", sorted(PIPELINES))
@pytest.mark.parametrize("group", [2, 1])
def test_pipeline_sync_every_batch_equals_1d(world4, kind: str, group: int) -> None:
    for result in world4.run(check_pipeline, kind, group, 1):
        assert result["moved"] > 1e-2, result  # the tables really trained
        assert result["table"] <= 1e-5 and result["dense"] <= 1e-5, result
        assert result["out"] <= 1e-5, result
        assert result["replicas"] == 4 // group
        assert result["diffs"] == [0.0] * BATCHES, result


@pytest.mark.parametrize("kind", sorted(PIPELINES))
def test_pipeline_interval_syncs_every_nth_batch(world4, kind: str) -> None:
    """TorchRec syncs after batch ``i`` when ``i % N == 0``: identical then, apart between."""
    for result in world4.run(check_pipeline, kind, 2, 3):
        for index, diff in enumerate(result["diffs"]):
            if index % 3 == 0:
                assert diff == 0.0, result
            else:
                assert diff > 1e-4, result


@pytest.mark.parametrize("kind", sorted(PIPELINES))
def test_pipeline_without_sync_drifts(world4, kind: str) -> None:
    for result in world4.run(check_pipeline, kind, 2, None):
        assert all(d > 1e-4 for d in result["diffs"]), result
        assert result["table"] > 1e-4, result  # and it is not 1D training any more


@pytest.mark.parametrize("inter_host", [False, True])
def test_torchrec_script_trains_and_syncs(world4, inter_host: bool) -> None:
    results = world4.run(check_torchrec_script, inter_host)
    groups = [[0, 1], [2, 3]] if inter_host else [[0, 2], [1, 3]]
    for rank, result in enumerate(results):
        assert result["is_torchrec"]
        assert result["sharding_group"] in groups and rank in result["sharding_group"]
        assert result["diffs"] == [0.0] * BATCHES
        assert result["moved"] > 1e-3


def test_torchrec_positional_call(world4) -> None:
    results = world4.run(check_positional_torchrec_call, True)
    assert [r["sharding_group"] for r in results] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert all(r["strategy"] == ShardingStrategy.PER_MODULE for r in results)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"sharding_group_size": 2, "world_size": 8}, "world_size=8 but the process group has 2"),
        (
            {
                "sharding_group_size": 2,
                "sharding_strategy": ShardingStrategy.FULLY_SHARDED,
                "sync_options": SyncOptions(every=4),
            },
            "sharding_strategy='FULLY_SHARDED' cannot run with sync_options.every=4",
        ),
        (
            {
                "sharding_group_size": 2,
                "replica_layout": "intra_host",
                "use_inter_host_allreduce": True,
            },
            "contradicts use_inter_host_allreduce",
        ),
    ],
)
def test_bad_torchrec_call_fails_on_every_rank(world2, kwargs: dict, needle: str) -> None:
    with pytest.raises(AssertionError) as info:
        world2.run(check_bad_call, kwargs)
    text = str(info.value)
    assert "failed on ranks [0, 1]" in text and needle in text, text


def test_torchrec_hook(world4) -> None:
    for result in world4.run(check_hook):
        assert result["calls"] >= 1 and result["diff"] <= 1e-6, result


# ---- pure checks (no process group) ----------------------------------------------------------
def test_call_forms_are_told_apart_by_the_second_argument() -> None:
    ours = parse_call((4,), {"device": "cpu", "constraints": {}})
    assert ours.sharding_group_size == 4 and ours.device == "cpu"
    auto = parse_call(("auto",), {})
    assert auto.sharding_group_size == "auto"
    theirs = parse_call(
        (torch.device("cpu"), None, 8, 2, None, ShardingStrategy.DEFAULT), {"sharders": []}
    )
    assert (theirs.device, theirs.world_size, theirs.sharding_group_size) == (
        torch.device("cpu"),
        8,
        2,
    )
    assert parse_call(("cuda", None, 8, 4), {}).sharding_group_size == 4
    assert parse_call((), {"sharding_group_size": 2}).device is None
    with pytest.raises(TypeError, match="multiple values"):
        parse_call((2,), {"sharding_group_size": 2})
    with pytest.raises(TypeError, match="unexpected keyword"):
        parse_call((2,), {"bogus": 1})
    with pytest.raises(TypeError, match="at most 1 positional"):
        parse_call((2, "cpu"), {})


def test_positional_names_match_installed_torchrec() -> None:
    """The TorchRec form follows the installed release's parameter order exactly."""
    names = list(inspect.signature(TorchRecDMPCollection.__init__).parameters)[2:]
    assert tuple(names) == TORCHREC_POSITIONAL


def test_torchrec_public_surface_is_ours() -> None:
    """Every public method/property of TorchRec's DMPCollection is overridden here, so nothing
    reaches TorchRec's code that reads state only its (unrun) constructor creates."""
    public = [n for n in vars(TorchRecDMPCollection) if not n.startswith("_")]
    assert "sync" in public
    owners = {n: next(c for c in DMPCollection.__mro__ if n in vars(c)) for n in public}
    missing = [n for n, c in owners.items() if not c.__module__.startswith("sparse2d.")]
    assert not missing, f"TorchRec's DMPCollection.{missing} is not overridden by sparse2d"
    shard_walk = next(c for c in DMPCollection.__mro__ if "_shard_modules_impl" in vars(c))
    assert shard_walk.__module__ == "sparse2d.core.collection"  # the core's, under the public


def test_layout_from_either_name() -> None:
    assert resolve_layout(None, None) == "intra_host"
    assert resolve_layout(None, True) == "inter_host"
    assert resolve_layout("inter_host", True) == "inter_host"
    with pytest.raises(ConfigError, match="contradicts"):
        resolve_layout("inter_host", False)


def test_hook_signatures() -> None:
    """One order, TorchRec's ``hook(tensors)``; a hook with a second positional parameter
    (either old order) is refused in one line naming the fix, never called with guesses."""
    seen: list[tuple] = []
    one = adapt_all_reduce(lambda tensors: seen.append(("one", tensors)))
    star = adapt_all_reduce(lambda *args: seen.append(("star", args)))
    for hook in (one, star):
        hook(["T"], "PG")  # type: ignore[misc, list-item, arg-type]
    assert seen == [("one", ["T"]), ("star", (["T"],))]
    old_orders = [
        lambda tensors, pg: None,
        lambda pg, tensors: None,
        lambda tensors, pg=None: None,  # would average over the default group: refused
    ]
    for old in old_orders:
        with pytest.raises(ConfigError, match=r"is called as hook\(tensors\)") as info:
            adapt_all_reduce(old)
        assert "model.replica_pg" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="must take one argument"):
        adapt_all_reduce(lambda: None)
    with pytest.raises(ConfigError, match="not callable"):
        adapt_all_reduce(3)  # type: ignore[arg-type]
    assert adapt_all_reduce(None) is None
