"""What a fault-tolerant step votes with: the control vector and the group's commit vote.

Each group adds its plan fingerprint and its NaN/inf flag to the step's cross-group average
(``FaultTolerance.finish_step``): a group with another plan, or a bad value anywhere, is
seen by every group from the average alone, with no collective of its own. Then the ranks of
each group agree whether the step commits (``group_commit``), in the all-reduce that also
finishes the dense gradients' average inside the group (``defer_group_reduction``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.nn.parallel import DistributedDataParallel

from sparse2d.errors import FaultToleranceError
from sparse2d.ft.options import FTOptions
from sparse2d.sync.shards import by_dtype

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


MANAGER_FIELDS = ("_step", "_batches_committed", "_commit_failures", "_checkpoint_transport")
"""What torchft 0.2's ``Manager.should_commit`` updates after its vote RPC (``group_commit``
does the same after its all-reduce); ``tests/test_ft_vote.py`` fails if a release renames them."""


def keep_local(_, bucket):  # type: ignore[no-untyped-def]  # DDP rejects string annotations
    """A DDP comm hook that reduces nothing: the bucket's gradients stay this rank's own."""
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def defer_group_reduction(model: nn.Module) -> bool:
    """Leave the group's dense gradient all-reduce to the commit vote (``group_commit``).

    A fault-tolerant step meets the group's other ranks at DDP's all-reduce and again at the
    vote; on a CPU host every meeting costs the ranks' skew plus a scheduling round. With
    DDP's own all-reduce replaced by ``keep_local``, the cross-group average runs on each
    rank's own gradients and the vote's all-reduce sums them over the group: one meeting
    fewer, the same mean over every rank of the quorum. Not done (False) when the dense part
    is not one DDP over this world or already has a comm hook (a carried NaN vote, a user's
    hook): DDP then reduces in the group as before."""
    ddp = getattr(model, "_dmp_wrapped_module", None)
    if not isinstance(ddp, DistributedDataParallel) or getattr(ddp, "_comm_hooks", None):
        return False
    if dist.get_world_size(ddp.process_group) != dist.get_world_size():
        return False
    ddp.register_comm_hook(None, keep_local)
    return True


def group_commit(
    manager: Any, pg: Any, options: FTOptions, bad_here: bool, grads: Sequence[torch.Tensor] = ()
) -> tuple[bool, bool]:
    """The commit vote of this group's ranks: torchft's ``Manager.should_commit`` with its
    RPC (every rank to the group's manager server and back) replaced by one SUM all-reduce
    over this torchrun world, which is the group, of each rank's "cannot commit" and
    "non-finite here" flags; ``grads`` (the dense gradients, when ``defer_group_reduction``
    left their group reduction to this vote) ride the same all-reduce and come back as their
    mean over the group. A rank of the group that is lost fails it at once, not after
    ``timeout_s``. The verdict and the bookkeeping are torchft's: a step commits only
    when every rank's cross-group process group (``pg``) and manager saw no error and the
    quorum has ``min_replica_size`` groups; on commit the step and committed batches advance,
    otherwise the consecutive failures count (the lighthouse regroups on them); the heal
    checkpoint stops being served. Different groups may decide differently, as with torchft.
    A vote that cannot complete (a rank of this group lost) is one line, not a traceback.
    Returns ``(committed, some rank of this group holds a non-finite value)``."""
    from torchft.utils import synchronize

    if torch.accelerator.is_available():  # errors of queued device work show only after it
        synchronize()
    if (error := pg.errored()) is not None:
        manager.report_error(error)
    here = manager.num_participants() >= options.min_replica_size and manager.errored() is None
    dtype = grads[0].dtype if grads else torch.float32  # small integer sums: exact in any
    flags = torch.tensor([0.0 if here else 1.0, 1.0 if bad_here else 0.0], dtype=dtype)
    try:
        _sum_over_group([*grads, flags])
    except Exception as error:
        raise FaultToleranceError(
            f"group {options.replica_id}: commit vote failed (a rank of this group was "
            f"lost?): {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        ) from None
    for grad in grads:
        grad.div_(dist.get_world_size())
    committed, group_bad = float(flags[0]) == 0.0, float(flags[1]) > 0.0
    manager._checkpoint_transport.disallow_checkpoint()
    if committed:
        manager._step += 1
        manager._batches_committed += manager.num_participants()
        manager._commit_failures = 0
    else:
        manager._commit_failures += 1
    return committed, group_bad


def _sum_over_group(tensors: list[torch.Tensor]) -> None:
    """SUM ``tensors`` in place over this world: one all-reduce per dtype."""
    for group in by_dtype(tensors).values():
        flat = _flatten_dense_tensors(group) if len(group) > 1 else group[0]
        dist.all_reduce(flat)
        if len(group) > 1:
            for tensor, summed in zip(group, _unflatten_dense_tensors(flat, group), strict=True):
                tensor.copy_(summed)
