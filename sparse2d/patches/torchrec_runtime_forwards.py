"""TorchRec's pipelined forwards assume CUDA when they have no stream.

Upstream: torchrec/distributed/train_pipeline/runtime_forwards.py:68 (``BaseForward.__init__``
takes its device from the data-dist stream, ``torch.device("cuda")`` without one).
Issue: none found (searched: BaseForward device cuda default, semi-sync CPU).
Without it: on a CPU-only build the semi-sync ``EmbeddingPipelinedForward`` calls
``torch.cuda.current_stream()`` and the pipeline fails on its first batch.
Probe: ``needed()`` builds TorchRec's own ``BaseForward`` without a stream on this host and
checks that its device is still CUDA while CUDA is not available (False on a CUDA host).
Fix: without a stream and without CUDA, the device is the CPU.
Regression test: ``tests/test_core_call_forms.py`` (``TrainPipelineSemiSync`` on CPU).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from sparse2d.patches._base import Patch, is_patched, mark, original_of

_SITE = "torchrec.distributed.train_pipeline.runtime_forwards:BaseForward.__init__"


def _device_on_cpu(original: Callable[..., Any]) -> Callable[..., Any]:
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if self._stream is None and not torch.cuda.is_available():
            self._device = torch.device("cpu")

    return mark(init, original)


def needed() -> bool:
    """Whether a pipelined forward without a stream still assumes CUDA on a CPU-only host."""
    from torchrec.distributed.train_pipeline import runtime_forwards

    if torch.cuda.is_available():
        return False
    probe = object.__new__(runtime_forwards.BaseForward)
    original_of(runtime_forwards.BaseForward.__init__)(probe, "probe", None, None, None, None)
    return probe._device.type == "cuda"


def apply() -> None:
    """Give stream-less forwards the CPU device on CPU-only hosts (idempotent)."""
    from torchrec.distributed.train_pipeline import runtime_forwards

    init = runtime_forwards.BaseForward.__init__
    if not is_patched(init) and needed():
        runtime_forwards.BaseForward.__init__ = _device_on_cpu(init)  # type: ignore[method-assign]


PATCHES = (
    Patch(
        name="torchrec_runtime_forwards",
        upstream="torchrec/distributed/train_pipeline/runtime_forwards.py:68",
        issue="none found",
        breaks="semi-sync pipelined forward calls torch.cuda on a CPU-only host",
        probe="TorchRec's BaseForward built without a stream still says cuda on a CPU-only host",
        needed=needed,
        apply=apply,
        sites=(_SITE,),
        devices=("cpu",),  # CUDA is the right default for a CUDA model
    ),
)
