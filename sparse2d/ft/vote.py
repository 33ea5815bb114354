"""The control vector: what a fault-tolerant step votes with, riding its one all-reduce.

Each group adds its plan fingerprint and its NaN/inf flag to the step's cross-group average
(``FaultTolerance.finish_step``): a group with another plan, or a bad value anywhere, is
seen by every group from the average alone, with no collective of its own.
"""

from __future__ import annotations

from typing import Any

import torch

from sparse2d.errors import FaultToleranceError
from sparse2d.ft.options import FTOptions

FINGERPRINT_BYTES = 6
"""``heal_state.fingerprint`` is a 48-bit hash; it travels as 6 bytes and their squares."""


def control_vector(fingerprint: int, bad: bool, grads: list[torch.Tensor]) -> torch.Tensor:
    """The step's vote payload, fp32 (or fp64 beside fp64 gradients) so that it rides the
    gradients' all-reduce: the fingerprint's bytes ``b``, their squares ``b*b`` (sums and
    averages exact enough to round back for < 128 groups) and the NaN/inf flag, last."""
    digits = [float((fingerprint >> (8 * i)) & 0xFF) for i in range(FINGERPRINT_BYTES)]
    wide = bool(grads) and grads[0].dtype == torch.float64  # bf16/fp16 would round b*b
    dtype = torch.float64 if wide else torch.float32
    return torch.tensor([*digits, *(d * d for d in digits), 1.0 if bad else 0.0], dtype=dtype)


def fingerprints_differ(control: torch.Tensor, fingerprint: int, groups: int) -> bool:
    """Whether some group in the quorum has another fingerprint: the sums (average times
    participants) of the bytes ``b`` and squares ``b*b`` equal ``n*b`` and ``n*b*b`` for
    every byte exactly when every group sent the same ``b`` (equality in Cauchy-Schwarz).
    ``control``: the average over the ``groups`` groups in the quorum."""
    n = groups
    sums = torch.round(control[: 2 * FINGERPRINT_BYTES].double() * n).tolist()
    for i in range(FINGERPRINT_BYTES):
        digit = (fingerprint >> (8 * i)) & 0xFF
        if sums[i] != n * digit or sums[FINGERPRINT_BYTES + i] != n * digit * digit:
            return True
    return False


def should_commit(manager: Any, options: FTOptions) -> bool:
    """torchft's commit vote over every rank of every group in the quorum; a vote that
    cannot complete (a rank of this group lost) is one line, not a traceback."""
    try:
        return bool(manager.should_commit())
    except Exception as error:
        raise FaultToleranceError(
            f"group {options.replica_id}: commit vote failed within fault_tolerance.timeout_s="
            f"{options.timeout_s:g} (a rank of this group was lost?): {type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}"
        ) from None
