"""TorchRec's train pipelines: CPU streams, and a notice of early lookups for the model.

Two patches of the same file, each with its own probe:

1. CPU streams.
Upstream: torchrec/distributed/train_pipeline/train_pipelines.py:1951 (``TrainPipelineSemiSync``
passes ``torch.get_device_module(device).current_stream()`` to ``_wait_for_events`` and
``_start_embedding_lookup``, which call ``record_stream`` with it; also :1543 for
``TrainPipelineFusedSparseDist``).
Issue: none found for CPU streams; the nearest, https://github.com/meta-pytorch/torchrec/pull/2683,
skips ``record_stream`` for CPU tensors, not for a CPU stream.
Without it: on CPU that stream is a ``torch.cpu.Stream``, which tensors reject ("unknown
parameter type"): the semi-sync pipeline cannot run on CPU at all.
Probe: ``needed()`` calls TorchRec's own ``_wait_for_events`` on a one-element tensor with the
CPU stream and checks that it still raises.
Fix: a CPU stream orders nothing: pass ``None`` (no stream), as the CUDA-less branches of the
same file do.

2. Early-lookup notice.
Upstream: torchrec/distributed/train_pipeline/train_pipelines.py:1667 (``TrainPipelineSemiSync.__init__``)
and :1468 (``TrainPipelineFusedSparseDist.__init__``): both start batch ``i+1``'s embedding
lookup before batch ``i``'s backward, and tell the model nothing.
Issue: none found (searched: TrainPipelineSemiSync managed collision, lookup before sync).
Without it: a replica sync between the lookup and its update is not seen: managed-collision
tables would update rows that now hold other ids, and touched-row engines would drop rows
updated after the sync. ``sparse2d.core.pipeline_guard`` registers the check run here.
Probe: ``early_lookup_needed()`` checks that the two classes still start lookups ahead
(their ``start_embedding_lookup`` calls ``_start_embedding_lookup``) and that their
``__init__`` takes no hook.
Fix: their ``__init__`` first runs each hook added by ``add_early_lookup_hook`` on the model.
Regression tests: ``tests/test_core_call_forms.py`` (semi-sync on CPU),
``tests/test_core_pipeline_guard.py`` (refused with replicated MC tables).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from sparse2d.patches._base import Patch, is_patched, mark, original_of

_STREAM_SITES = (
    "torchrec.distributed.train_pipeline.train_pipelines:_wait_for_events",
    "torchrec.distributed.train_pipeline.train_pipelines:_start_embedding_lookup",
)
_EARLY = ("TrainPipelineSemiSync", "TrainPipelineFusedSparseDist")
_EARLY_SITES = tuple(
    f"torchrec.distributed.train_pipeline.train_pipelines:{name}.__init__" for name in _EARLY
)
_HOOKS: list[Callable[[Any, str], None]] = []


def _without_cpu_stream(original: Callable[..., Any], position: int) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        if len(args) > position and isinstance(args[position], torch.cpu.Stream):
            args = (*args[:position], None, *args[position + 1 :])
        for key in ("stream", "target_stream"):
            if isinstance(kwargs.get(key), torch.cpu.Stream):
                kwargs[key] = None
        return original(*args, **kwargs)

    return mark(call, original)


def needed() -> bool:
    """Whether TorchRec's ``_wait_for_events`` still fails with a CPU stream."""
    from torchrec.distributed.train_pipeline import train_pipelines
    from torchrec.distributed.train_pipeline.pipeline_context import TrainPipelineContext

    wait = original_of(train_pipelines._wait_for_events)
    try:
        wait(torch.empty(1), TrainPipelineContext(), torch.cpu.current_stream())
    except (RuntimeError, TypeError):
        return True
    return False


def apply() -> None:
    """Drop CPU streams before TorchRec records tensors on them (idempotent)."""
    from torchrec.distributed.train_pipeline import train_pipelines

    sites = (("_wait_for_events", 2), ("_start_embedding_lookup", 3))
    pending = [(n, p) for n, p in sites if not is_patched(getattr(train_pipelines, n))]
    if not pending or not needed():
        return
    for name, position in pending:
        setattr(
            train_pipelines, name, _without_cpu_stream(getattr(train_pipelines, name), position)
        )


def add_early_lookup_hook(hook: Callable[[Any, str], None]) -> None:
    """Run ``hook(model, pipeline class name)`` when an early-lookup pipeline is built over
    ``model`` (before TorchRec's ``__init__``; once per hook however often it is added)."""
    if hook not in _HOOKS:
        _HOOKS.append(hook)


def _noticing(init: Callable[..., Any], name: str) -> Callable[..., Any]:
    def noticing(self: Any, model: Any, *args: Any, **kwargs: Any) -> None:
        for hook in list(_HOOKS):
            hook(model, name)
        init(self, model, *args, **kwargs)

    return mark(noticing, init)


def _early_classes() -> list[type]:
    from torchrec.distributed.train_pipeline import train_pipelines

    found = (getattr(train_pipelines, name, None) for name in _EARLY)
    return [cls for cls in found if cls is not None and "__init__" in cls.__dict__]


def early_lookup_needed() -> bool:
    """Whether the early-lookup pipelines still look up ahead with no hook for the model."""
    classes = _early_classes()
    if not classes:
        return False
    for cls in classes:
        init = original_of(cls.__dict__["__init__"])
        hooks = [p for p in inspect.signature(init).parameters if "hook" in p or "callback" in p]
        lookup = cls.__dict__.get("start_embedding_lookup")
        if hooks or lookup is None or "_start_embedding_lookup(" not in inspect.getsource(lookup):
            return False
    return True


def apply_early_lookup_notice() -> None:
    """Make the early-lookup pipelines run the added hooks on their model (idempotent)."""
    pending = [cls for cls in _early_classes() if not is_patched(cls.__dict__["__init__"])]
    if not pending or not early_lookup_needed():
        return
    for cls in pending:
        cls.__init__ = _noticing(cls.__dict__["__init__"], cls.__name__)  # type: ignore[misc]


PATCHES = (
    Patch(
        name="torchrec_train_pipelines.cpu_streams",
        upstream="torchrec/distributed/train_pipeline/train_pipelines.py:1951",
        issue="none found; nearest: https://github.com/meta-pytorch/torchrec/pull/2683 (CPU tensors)",
        breaks="TrainPipelineSemiSync cannot run on CPU (record_stream with a CPU stream)",
        probe="TorchRec's _wait_for_events on a tiny tensor with the CPU stream still raises",
        needed=needed,
        apply=apply,
        sites=_STREAM_SITES,
        devices=("cpu",),  # only a CPU stream is refused
    ),
    Patch(
        name="torchrec_train_pipelines.early_lookup",
        upstream="torchrec/distributed/train_pipeline/train_pipelines.py:1667",
        issue="none found",
        breaks="semi-sync/fused pipelines look up before the sync unseen: MC rows mixed up, touched rows lost",
        probe="both classes' start_embedding_lookup still calls _start_embedding_lookup; no hook in __init__",
        needed=early_lookup_needed,
        apply=apply_early_lookup_notice,
        sites=_EARLY_SITES,
    ),
)
