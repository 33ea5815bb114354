"""Narrow workarounds for TorchRec behaviour that breaks 2D sharding or CPU pipelines.

Each fix names the TorchRec file it works around, is applied idempotently by
``DMPCollection`` (or by calling ``apply_torchrec_fixes``), delegates to TorchRec for
every case it does not fix, and is installed only while the installed TorchRec still
shows the problem (feature detection, no version numbers), so an upstream fix wins.
Re-checked against TorchRec 1.8.0 and 1.9.2: all are still needed on both. Regression
tests: ``tests/test_collection.py`` (TWCW with empty ranks; two 2D layouts in one process),
``tests/test_planner_torchrec_fixes.py`` (row-wise with a different batch size per rank),
``tests/test_torchrec_compat.py`` (``TrainPipelineSemiSync`` on CPU).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torchrec.distributed.embedding as trec_embedding
import torchrec.distributed.embeddingbag as trec_embeddingbag
from torchrec.distributed.types import ParameterSharding, ShardingType

_ORIGINAL = "_sparse2d_original"


def _global_shape_with_table_column_wise(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torchrec/distributed/utils.py::create_global_tensor_shape_stride_from_metadata`` has
    no ``TABLE_COLUMN_WISE`` branch and returns ``shape=None``. 2D sharding outputs DTensors,
    and a rank of the group that holds no shard of a TWCW table then crashes in
    ``DTensor.from_local`` (``ShardedEmbeddingBagCollection._initialize_torch_state``).
    TWCW shards are column blocks of the full table, exactly like column-wise ones."""

    def shape_and_stride(
        parameter_sharding: ParameterSharding, devices_per_node: int | None = None
    ) -> tuple[torch.Size, tuple[int, int]]:
        if parameter_sharding.sharding_type != ShardingType.TABLE_COLUMN_WISE.value:
            return original(parameter_sharding, devices_per_node)
        shards = parameter_sharding.sharding_spec.shards  # type: ignore[union-attr]
        rows = shards[0].shard_sizes[0]
        cols = sum(shard.shard_sizes[1] for shard in shards)
        return torch.Size([rows, cols]), (cols, 1)

    setattr(shape_and_stride, _ORIGINAL, original)
    return shape_and_stride


def _without_cpu_stream(original: Callable[..., Any], position: int) -> Callable[..., Any]:
    """``torchrec/distributed/train_pipeline/train_pipelines.py``: ``TrainPipelineSemiSync``
    passes ``torch.get_device_module(device).current_stream()`` to ``_wait_for_events`` and
    ``_start_embedding_lookup``, which call ``record_stream`` with it; on CPU that is a
    ``torch.cpu.Stream``, which tensors reject ("unknown parameter type"), so the pipeline
    cannot run on CPU at all. A CPU stream orders nothing: pass ``None`` (no stream), as
    the CUDA-less branches of the same file do."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if len(args) > position and isinstance(args[position], torch.cpu.Stream):
            args = (*args[:position], None, *args[position + 1 :])
        for key in ("stream", "target_stream"):
            if isinstance(kwargs.get(key), torch.cpu.Stream):
                kwargs[key] = None
        return original(*args, **kwargs)

    setattr(call, _ORIGINAL, original)
    return call


def _forward_device_on_cpu(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torchrec/distributed/train_pipeline/runtime_forwards.py``: ``BaseForward`` takes its
    device from the data-dist stream and assumes ``cuda`` without one, so the semi-sync
    ``EmbeddingPipelinedForward`` calls ``torch.cuda.current_stream()`` on a CPU-only build.
    Without a stream and without CUDA, the device is the CPU."""

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if self._stream is None and not torch.cuda.is_available():
            self._device = torch.device("cpu")

    setattr(init, _ORIGINAL, original)
    return init


def _record_stream_skipping_cpu(original: Callable[..., Any]) -> Callable[..., Any]:
    """``runtime_forwards.py``: ``EmbeddingPipelinedForward.detach_embeddings`` records the
    pooled ``KeyedTensor`` on the current stream; a CPU stream orders nothing, and tensors
    reject it, so recording on it is skipped."""

    def record_stream(self: Any, stream: Any) -> None:
        if not isinstance(stream, torch.cpu.Stream):
            original(self, stream)

    setattr(record_stream, _ORIGINAL, original)
    return record_stream


class _Completed:
    """A finished request: what TorchRec's ``Request.req.wait()`` expects."""

    def wait(self) -> bool:
        return True


def _uneven_all_gather_on_gloo(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torchrec/distributed/comm_ops.py::ReduceScatterV_Wait.backward`` all-gathers the
    gradient of a row-wise (or TWRW) output with uneven splits, i.e. different batch sizes
    per rank, through ``dist.all_gather``; gloo refuses uneven blocks ("invalid tensor
    size"), so such a backward fails on CPU, TorchRec's 1D included. On gloo: gather blocks
    padded to the largest split (blocking) and keep each rank's rows."""

    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        import torch.distributed as dist

        rsi = ctx.myreq.rsi
        if rsi.equal_splits or dist.get_backend(ctx.pg) != "gloo":
            return original(ctx, grad_output)
        if rsi.codecs is not None:
            grad_output = rsi.codecs.backward.encode(grad_output)
        grad_input = grad_output.new_empty(rsi.total_input_size)
        splits = list(rsi.input_splits)
        padded = grad_output.new_zeros((max(splits), *grad_output.shape[1:]))
        padded[: grad_output.shape[0]].copy_(grad_output)
        blocks = [torch.empty_like(padded) for _ in splits]
        dist.all_gather(blocks, padded, group=ctx.pg)
        for out, block, rows in zip(torch.split(grad_input, splits), blocks, splits, strict=True):
            out.copy_(block[:rows])
        ctx.myreq.req = _Completed()
        ctx.myreq.tensor = grad_input
        return (None, None, ctx.myreq.dummy_tensor)

    setattr(backward, _ORIGINAL, original)
    return backward


def uneven_all_gather_used(backward: Callable[..., Any]) -> bool:
    """Whether TorchRec's reduce-scatter-v backward still calls ``dist.all_gather`` on uneven
    splits (gloo supports only equal blocks)."""
    import inspect

    try:
        return "dist.all_gather(" in inspect.getsource(backward)
    except (OSError, TypeError):
        return False


def twcw_shape_missing(original: Callable[..., Any]) -> bool:
    """Whether ``original`` still returns no global shape for a table-column-wise table."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec

    blocks = [ShardMetadata([0, c], [4, 2], f"rank:{r}/cpu") for r, c in ((0, 0), (1, 2))]
    sharding = ParameterSharding(
        sharding_type=ShardingType.TABLE_COLUMN_WISE.value,
        compute_kernel="fused",
        ranks=[0, 1],
        sharding_spec=EnumerableShardingSpec(blocks),
    )
    try:
        shape, _ = original(sharding, None)
    except Exception:  # any failure on TWCW is the bug being worked around
        return True
    return shape is None


def cpu_streams_rejected() -> bool:
    """Whether tensors still refuse ``record_stream`` with a CPU stream (TorchRec's
    pipelines call it with ``torch.cpu.current_stream()`` on CPU)."""
    try:
        torch.empty(1).record_stream(torch.cpu.current_stream())  # type: ignore[arg-type]
    except (RuntimeError, TypeError):
        return True
    return False


def forward_device_defaults_to_cuda(runtime_forwards: Any) -> bool:
    """Whether a pipelined forward without a stream still assumes CUDA on a CPU-only host."""
    if torch.cuda.is_available():
        return False
    probe = runtime_forwards.BaseForward("probe", None, None, None, None)
    return probe._device.type == "cuda"


def groups_2d_cached_per_process(comm: Any) -> bool:
    """Whether TorchRec still keeps ONE pair of 2D intra/cross-node groups per process."""
    return hasattr(comm, "_INTRA_PG_2D") and hasattr(comm, "_CROSS_PG_2D")


def _groups_2d_per_layout(original: Callable[..., Any], comm: Any) -> Callable[..., Any]:
    """``torchrec/distributed/comm.py`` ``intra_and_cross_node_pg_2D`` creates the TWRW/grid
    intra- and cross-node groups of the FIRST 2D model of a process and returns them for
    every later one: a second model with another layout (replica layout, group size, node
    group size) would run its all-to-alls over the first model's ranks, silently wrong.
    Keyed by the model's own sharding group (the process group object, so each model's
    TWRW and grid shardings share one pair, created while that model is built and
    destroyed by its ``close()``) and the node group size and layout."""
    made: dict[tuple[Any, ...], tuple[Any, Any]] = {}

    def groups(env: Any, device: Any = None) -> Any:
        if device is not None and device.type == "meta":
            return original(env, device)
        key = (
            env.sharding_pg,
            env.node_group_size,
            getattr(env, "use_inter_host_allreduce", False),
        )
        comm._INTRA_PG_2D, comm._CROSS_PG_2D = made.get(key, (None, None))
        made[key] = original(env, device)
        return made[key]

    def forget_destroyed() -> None:
        """Drop the groups of closed models: a reference kept here keeps their threads. An
        entry goes when its key group *or* its own pair is gone: with ``L`` = world the key
        is the job's group, which outlives the model, and a later model of that layout
        would otherwise get the closed model's destroyed pair ("group is not registered")."""
        for key in [
            k for k, pair in made.items()
            if not _registered(k[0]) or not all(_registered(g) for g in pair if g is not None)
        ]:  # fmt: skip
            del made[key]
        for name in ("_INTRA_PG_2D", "_CROSS_PG_2D"):
            group = getattr(comm, name)
            if group is not None and not _registered(group):
                setattr(comm, name, None)

    setattr(groups, _ORIGINAL, original)
    groups.forget_destroyed = forget_destroyed  # type: ignore[attr-defined]
    return groups


def forget_destroyed_groups() -> None:
    """Called after a model's groups are destroyed (``sparse2d.resources``)."""
    from torchrec.distributed import comm

    forget = getattr(comm.intra_and_cross_node_pg_2D, "forget_destroyed", None)
    if forget is not None:
        forget()


def _registered(group: Any) -> bool:
    from torch.distributed import distributed_c10d

    return group in distributed_c10d._world.pg_map


def apply_torchrec_fixes() -> None:
    """Install the workarounds still needed (safe to call many times)."""
    from torchrec.distributed import comm, comm_ops
    from torchrec.distributed.sharding import grid_sharding, twrw_sharding

    wait = comm_ops.ReduceScatterV_Wait
    if not hasattr(wait.backward, _ORIGINAL) and uneven_all_gather_used(wait.backward):
        wait.backward = staticmethod(_uneven_all_gather_on_gloo(wait.backward))  # type: ignore[method-assign]

    current = comm.intra_and_cross_node_pg_2D
    if not hasattr(current, _ORIGINAL) and groups_2d_cached_per_process(comm):
        fixed = _groups_2d_per_layout(current, comm)
        for module in (comm, grid_sharding, twrw_sharding):
            module.intra_and_cross_node_pg_2D = fixed  # type: ignore[attr-defined]
    for module in (trec_embeddingbag, trec_embedding):
        current = module.create_global_tensor_shape_stride_from_metadata
        if not hasattr(current, _ORIGINAL) and twcw_shape_missing(current):
            module.create_global_tensor_shape_stride_from_metadata = (
                _global_shape_with_table_column_wise(current)
            )
    from torchrec.distributed.train_pipeline import runtime_forwards, train_pipelines
    from torchrec.sparse.jagged_tensor import KeyedTensor

    init = runtime_forwards.BaseForward.__init__
    if not hasattr(init, _ORIGINAL) and forward_device_defaults_to_cuda(runtime_forwards):
        runtime_forwards.BaseForward.__init__ = _forward_device_on_cpu(init)  # type: ignore[method-assign]
    if not cpu_streams_rejected():
        return
    for name, position in (("_wait_for_events", 2), ("_start_embedding_lookup", 3)):
        current = getattr(train_pipelines, name)
        if not hasattr(current, _ORIGINAL):
            setattr(train_pipelines, name, _without_cpu_stream(current, position))
    if not hasattr(KeyedTensor.record_stream, _ORIGINAL):
        KeyedTensor.record_stream = _record_stream_skipping_cpu(KeyedTensor.record_stream)  # type: ignore[method-assign]
