"""TorchRec users' code runs unchanged: pipelines sync our replicas, TorchRec's call works.

Mirrors ``sparse2d/core/call_forms.py`` (call parsing) and the TorchRec-facing side of
``sparse2d/core/collection.py``. References are TorchRec's own 1D ``DistributedModelParallel``
driven by the same TorchRec train pipeline.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torchrec
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
    adapt_custom_all_reduce,
    adapt_set_all_reduce_hook,
    hook_roles,
    installed_contract,
    parse_call,
    read_contract,
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
RELEASE = torchrec.__version__
ON_1_8 = pytest.mark.skipif(
    not RELEASE.startswith("1.8."),
    reason=f"TorchRec 1.8's hook contract; torchrec {RELEASE} is installed",
)
ON_1_9 = pytest.mark.skipif(
    not RELEASE.startswith("1.9."),
    reason=f"TorchRec 1.9's hook contract (make install TORCHREC=1.9); torchrec {RELEASE} is installed",
)
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


def check_hook_is_the_sync(door: str, takes_group: bool) -> dict:
    """A hook given at ``door`` (``hook(pg, tensors)`` if ``takes_group``, else
    ``hook(tensors)`` closing over ``model.replica_pg``) writes the replica mean + 1: that,
    never the plain average, must be what ``sync()`` leaves on every replica. The wrong
    arity is refused first, on every rank."""
    groups: list[dist.ProcessGroup] = []

    def mean_plus_one(pg: dist.ProcessGroup, tensors: list[torch.Tensor]) -> None:
        groups.append(pg)
        for t in tensors:
            dist.all_reduce(t, group=pg)
            t.div_(dist.get_world_size(pg)).add_(1.0)

    def with_group(pg: dist.ProcessGroup, tensors: list[torch.Tensor]) -> None:
        mean_plus_one(pg, tensors)

    def closing_over_group(tensors: list[torch.Tensor]) -> None:
        mean_plus_one(model.replica_pg, tensors)

    hook, wrong = (with_group, closing_over_group)[:: 1 if takes_group else -1]
    if door == "custom_all_reduce":
        with pytest.raises(ConfigError) as refused:
            DMPCollection(build_model(MIXED_TABLES), 2, device="cpu", custom_all_reduce=wrong)
        model = DMPCollection(build_model(MIXED_TABLES), 2, device="cpu", custom_all_reduce=hook)
    else:
        model = DMPCollection(build_model(MIXED_TABLES), 2, device="cpu")
        with pytest.raises(ConfigError) as refused:
            model.set_all_reduce_hook(wrong)
        model.set_all_reduce_hook(hook)
    for shard in model.shard_states:  # make replicas differ, then sync through the hook
        shard.weight.add_(float(dist.get_rank()))
    expected = []
    for shard in model.shard_states:
        mean = shard.weight.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG, group=model.replica_pg)
        expected.append(mean + 1.0)
    model.sync()
    pairs = zip(model.shard_states, expected, strict=True)
    return {
        "refused": str(refused.value),
        "calls": len(groups),
        "replica_group": all(pg is model.replica_pg for pg in groups),
        "worst": max(float((s.weight - e).abs().max()) for s, e in pairs),
        "diff": replica_max_diff(model, model.replica_pg),
    }


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


@ON_1_8
def test_set_all_reduce_hook_takes_hook_tensors_on_1_8(world4) -> None:
    """TorchRec 1.8.0's ``set_all_reduce_hook(hook(tensors))``: its result is the sync."""
    for result in world4.run(check_hook_is_the_sync, "set_all_reduce_hook", False):
        assert result["calls"] >= 1 and result["worst"] == 0.0 and result["diff"] == 0.0, result
        assert "is called as hook(tensors)" in result["refused"], result
        assert "TorchRec 1.8.0's set_all_reduce_hook" in result["refused"], result


@ON_1_9
def test_set_all_reduce_hook_takes_hook_pg_tensors_on_1_9(world4) -> None:
    """TorchRec 1.9.2's ``set_all_reduce_hook(hook(pg, tensors))``: called with the replica
    group, and its result is the sync."""
    for result in world4.run(check_hook_is_the_sync, "set_all_reduce_hook", True):
        assert result["calls"] >= 1 and result["replica_group"], result
        assert result["worst"] == 0.0 and result["diff"] == 0.0, result
        assert "is called as hook(pg, tensors)" in result["refused"], result
        assert "TorchRec 1.9.2's set_all_reduce_hook" in result["refused"], result


def test_custom_all_reduce_takes_hook_tensors(world4) -> None:
    """The constructor's ``custom_all_reduce(hook(tensors))`` on every supported release."""
    for result in world4.run(check_hook_is_the_sync, "custom_all_reduce", False):
        assert result["calls"] >= 1 and result["worst"] == 0.0 and result["diff"] == 0.0, result
        assert "is called as hook(tensors)" in result["refused"], result
        assert f"TorchRec {RELEASE}'s custom_all_reduce" in result["refused"], result


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


def test_custom_all_reduce_signatures() -> None:
    """The constructor's door, ``hook(tensors)`` on both releases; a hook with a second
    positional parameter (either order) is refused in one line naming the fix, never called
    with guesses."""
    seen: list[tuple] = []
    one = adapt_custom_all_reduce(lambda tensors: seen.append(("one", tensors)))
    star = adapt_custom_all_reduce(lambda *args: seen.append(("star", args)))
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
            adapt_custom_all_reduce(old)
        assert "model.replica_pg" in str(info.value) and "\n" not in str(info.value)
        assert f"TorchRec {RELEASE}'s custom_all_reduce" in str(info.value)
    with pytest.raises(ConfigError, match="must take one argument"):
        adapt_custom_all_reduce(lambda: None)
    with pytest.raises(ConfigError, match="not callable"):
        adapt_custom_all_reduce(3)  # type: ignore[arg-type]
    assert adapt_custom_all_reduce(None) is None


@ON_1_8
def test_set_all_reduce_hook_signatures_on_1_8() -> None:
    """TorchRec 1.8.0 types ``set_all_reduce_hook``'s hook ``Callable[[List[Tensor]], None]``."""
    assert installed_contract("set_all_reduce_hook").roles == ("tensors",)
    assert installed_contract("custom_all_reduce").roles == ("tensors",)
    seen: list = []
    adapt_set_all_reduce_hook(lambda pg: seen.append(pg))(["T"], "PG")  # type: ignore[misc]
    assert seen == [["T"]]  # the order is TorchRec's, never read from parameter names
    for two in (lambda pg, tensors: None, lambda tensors, pg: None):
        with pytest.raises(ConfigError, match=r"is called as hook\(tensors\)") as info:
            adapt_set_all_reduce_hook(two)
        assert "TorchRec 1.8.0's set_all_reduce_hook" in str(info.value)
        assert "model.replica_pg" in str(info.value) and "\n" not in str(info.value)


@ON_1_9
def test_set_all_reduce_hook_signatures_on_1_9() -> None:
    """TorchRec 1.9.2 types it ``Callable[[ProcessGroup, List[Tensor]], None]`` and calls
    ``hook(ctx.replica_pg, tensors)``; its constructor's hook stays ``hook(tensors)``."""
    assert installed_contract("set_all_reduce_hook").roles == ("pg", "tensors")
    assert installed_contract("custom_all_reduce").roles == ("tensors",)
    seen: list = []
    adapt_set_all_reduce_hook(lambda tensors, pg: seen.append((tensors, pg)))(["T"], "PG")  # type: ignore[misc, arg-type]
    assert seen == [("PG", ["T"])]  # the order is TorchRec's, never read from parameter names
    adapt_set_all_reduce_hook(lambda *args: seen.append(args))(["T"], "PG")  # type: ignore[misc, arg-type]
    assert seen[-1] == ("PG", ["T"])
    for wrong in (lambda tensors: None, lambda pg, tensors, extra: None):
        with pytest.raises(ConfigError, match=r"is called as hook\(pg, tensors\)") as info:
            adapt_set_all_reduce_hook(wrong)
        assert "TorchRec 1.9.2's set_all_reduce_hook" in str(info.value)
        assert "custom_all_reduce" in str(info.value) and "\n" not in str(info.value)


def test_hook_roles_read_the_annotation() -> None:
    """Both releases' call forms parse from their annotation (``Optional`` unwrapped); one
    sparse2d could not adapt parses to ``None``."""
    tensors = list[torch.Tensor]
    assert hook_roles(Callable[[tensors], None]) == ("tensors",)
    assert hook_roles(Callable[[tensors], None] | None) == ("tensors",)
    assert hook_roles(Callable[[dist.ProcessGroup, tensors], None]) == ("pg", "tensors")
    assert hook_roles(Callable[[tensors, dist.ProcessGroup], None]) == ("tensors", "pg")
    unknown = [Callable[..., None], Callable[[torch.Tensor], None], Callable[[], None], int]
    unknown.append(Callable[[tensors, tensors], None])
    for annotation in unknown:
        assert hook_roles(annotation) is None, annotation


def test_unknown_contract_is_refused_naming_it() -> None:
    """A release whose hook annotation sparse2d cannot adapt is refused, never guessed."""

    def takes_any(reduce_hook: Callable[..., None]) -> None:  # a release typing it loosely
        del reduce_hook

    with pytest.raises(ConfigError, match=r"set_all_reduce_hook hook is typed .*does not know"):
        read_contract(takes_any, "reduce_hook", "set_all_reduce_hook")
    contract = read_contract(TorchRecDMPCollection.__init__, "custom_all_reduce", "door")
    assert contract.roles == ("tensors",) and contract.release == RELEASE
