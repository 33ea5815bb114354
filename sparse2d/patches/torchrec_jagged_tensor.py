"""``KeyedTensor.record_stream`` passes a CPU stream on to its values, which refuse it.

Upstream: torchrec/sparse/jagged_tensor.py:3735 (``KeyedTensor.record_stream``), called with
the current stream by ``EmbeddingPipelinedForward.detach_embeddings``
(``torchrec/distributed/train_pipeline/runtime_forwards.py:229``).
Issue: none found for a CPU stream; https://github.com/meta-pytorch/torchrec/pull/2683 skips
``record_stream`` for CPU *tensors* elsewhere.
Without it: the semi-sync pipeline fails on CPU when it detaches the pooled embeddings
("unknown parameter type").
Probe: ``needed()`` calls TorchRec's own ``record_stream`` of a one-key ``KeyedTensor`` with
the CPU stream and checks that it still raises.
Fix: a CPU stream orders nothing: recording on it is skipped; other streams go to TorchRec.
Regression test: ``tests/test_core_call_forms.py`` (``TrainPipelineSemiSync`` on CPU).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from sparse2d.patches._base import Patch, is_patched, mark, original_of

_SITE = "torchrec.sparse.jagged_tensor:KeyedTensor.record_stream"


def _skipping_cpu(original: Callable[..., Any]) -> Callable[..., Any]:
    def record_stream(self: Any, stream: Any) -> None:
        if not isinstance(stream, torch.cpu.Stream):
            original(self, stream)

    return mark(record_stream, original)


def needed() -> bool:
    """Whether TorchRec's ``KeyedTensor.record_stream`` still fails with a CPU stream."""
    from torchrec.sparse.jagged_tensor import KeyedTensor

    keyed = KeyedTensor(keys=["f"], length_per_key=[1], values=torch.zeros(1, 1))
    try:
        original_of(KeyedTensor.record_stream)(keyed, torch.cpu.current_stream())
    except (RuntimeError, TypeError):
        return True
    return False


def apply() -> None:
    """Skip recording on CPU streams (idempotent)."""
    from torchrec.sparse.jagged_tensor import KeyedTensor

    if not is_patched(KeyedTensor.record_stream) and needed():
        KeyedTensor.record_stream = _skipping_cpu(KeyedTensor.record_stream)  # type: ignore[method-assign]


PATCHES = (
    Patch(
        name="torchrec_jagged_tensor",
        upstream="torchrec/sparse/jagged_tensor.py:3735",
        issue="none found; nearest: https://github.com/meta-pytorch/torchrec/pull/2683 (CPU tensors)",
        breaks="semi-sync pipeline fails on CPU detaching the pooled KeyedTensor",
        probe="TorchRec's KeyedTensor.record_stream with the CPU stream still raises",
        needed=needed,
        apply=apply,
        sites=(_SITE,),
        devices=("cpu",),  # only a CPU stream is refused
    ),
)
