"""What a fault-tolerant step votes with: the control vector and the group's commit vote.

Each group adds its plan fingerprint and its NaN/inf flag to the step's cross-group average
(``FaultTolerance.finish_step``): a group with another plan, or a bad value anywhere, is
seen by every group from the average alone, with no collective of its own. Then the ranks of
each group agree whether the step commits (``GroupVote``), and whether some rank of the
group found a non-finite value (the whole group then stops and restarts as one).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from sparse2d.comm_device import flag_device
from sparse2d.errors import FaultToleranceError
from sparse2d.ft.ft_options import FTOptions
from sparse2d.sync.guard import all_finite

FINGERPRINT_BYTES = 6
"""``heal_state.fingerprint`` is a 48-bit hash; it travels as 6 bytes and their squares."""


def control_vector(fingerprint: int, bad: bool, grads: list[torch.Tensor]) -> torch.Tensor:
    """The step's vote payload, fp32 (or fp64 beside fp64 gradients) so that it rides the
    gradients' all-reduce: the fingerprint's bytes ``b``, their squares ``b*b`` (sums and
    averages exact enough to round back for < 128 groups) and the NaN/inf flag, last."""
    digits = [float((fingerprint >> (8 * i)) & 0xFF) for i in range(FINGERPRINT_BYTES)]
    dtype = control_dtype(grads)
    device = grads[0].device if grads else None  # beside the gradients it is sent with
    values = [*digits, *(d * d for d in digits), 1.0 if bad else 0.0]
    return torch.tensor(values, dtype=dtype, device=device)


class ControlVectors:
    """Each step's control vector, copied from one built for the run: the fingerprint and
    the gradients' dtype and device stay (a dtype change rebuilds it)."""

    def __init__(self, fingerprint: int) -> None:
        self.fingerprint = fingerprint
        self._template: torch.Tensor | None = None

    def build(self, grads: list[torch.Tensor], bad: bool) -> torch.Tensor:
        """``control_vector(fingerprint, bad, grads)``, without rebuilding it from Python."""
        template = self._template
        if template is None or template.dtype != control_dtype(grads):
            template = self._template = control_vector(self.fingerprint, False, grads)
        control = template.clone()
        if bad:
            control[-1] = 1.0
        return control


def control_dtype(grads: list[torch.Tensor]) -> torch.dtype:
    """fp64 beside fp64 gradients, else fp32 (bf16/fp16 would round ``b*b``)."""
    return torch.float64 if grads and grads[0].dtype == torch.float64 else torch.float32


def fingerprints_differ(control: torch.Tensor | list[float], fingerprint: int, groups: int) -> bool:
    """Whether some group in the quorum has another fingerprint: the sums (average times
    participants) of the bytes ``b`` and squares ``b*b`` equal ``n*b`` and ``n*b*b`` for
    every byte exactly when every group sent the same ``b`` (equality in Cauchy-Schwarz).
    ``control``: the average over the ``groups`` groups in the quorum (or its ``tolist()``,
    which the step reads once: one device read, no tensor ops on the step's path)."""
    n = groups
    values = control.tolist() if isinstance(control, torch.Tensor) else control
    sums = [round(v * n) for v in values[: 2 * FINGERPRINT_BYTES]]
    for i in range(FINGERPRINT_BYTES):
        digit = (fingerprint >> (8 * i)) & 0xFF
        if sums[i] != n * digit or sums[FINGERPRINT_BYTES + i] != n * digit * digit:
            return True
    return False


class SentScan:
    """``ManagedChannel.start_tensors``'s ``before_send`` for one step: a NaN/inf scan of
    each buffer sent (the sync's copies, the dense gradients and the control vector
    together: one sum per buffer instead of one per tensor), then the flag set in the
    control vector's copy, which ends its dtype's buffer.

    ``scan_sent`` False (``check_finite`` off while a sync sends): only the dense gradients
    are scanned. ``aside``: values that went over the quorum outside the step's buffers
    (``ManagedChannel.sent_aside``: managed-collision rows), scanned live, one by one."""

    def __init__(
        self,
        control: torch.Tensor,
        grads: list[torch.Tensor],
        scan_sent: bool,
        aside: list[torch.Tensor],
        bad: bool | None = None,
    ) -> None:
        self.control, self.scan_sent = control, scan_sent
        self.bad = bool(control[-1] > 0) if bad is None else bad
        """This rank sends a non-finite value (or its sync's guard found one); ``bad``: the
        flag the control vector was built with, known without reading it back."""
        for tensor in aside if scan_sent else grads:
            self.bad = self.bad or not all_finite(tensor)

    def __call__(self, flats: list[torch.Tensor]) -> None:
        if self.scan_sent and not self.bad:
            self.bad = not all(all_finite(flat) for flat in flats)
        if self.bad:
            for flat in flats:
                if flat.dtype == self.control.dtype:
                    flat[-1] = 1.0


MANAGER_FIELDS = (
    "_step",
    "_batches_committed",
    "_commit_failures",
    "_checkpoint_transport",
    "_errored",
)
"""What torchft 0.2's ``Manager.should_commit`` updates after its vote RPC (``GroupVote.land``
does the same after its all-reduce), and its error, which ``FaultTolerance.land`` clears after
a late failed commit; ``tests/test_ft_vote.py`` fails if a release renames them."""


class GroupVote:
    """The commit vote of this group's ranks: torchft's ``Manager.should_commit`` with its
    RPC (every rank to the group's manager server and back) replaced by one SUM all-reduce
    over this torchrun world, which is the group, of each rank's "cannot commit" and
    "non-finite here" flags. Started as soon as the step's cross-group all-reduce landed;
    ``land()`` waits for it and does torchft's bookkeeping, at once or at the next forward
    (``FaultTolerance.finish_step(defer=True)``): the wait is the skew between the group's
    ranks (each left its cross-group all-reduce with a different peer), and landing it late
    lets the pipeline's next input all-to-all and data overlap it. (Carrying the dense
    gradients' group sum in it instead of DDP's all-reduce measured no gain: the skew DDP
    absorbed moved here, docs/fault_tolerance.md.) A rank of the group that is lost fails
    it at once, not after ``timeout_s``. The verdict and the bookkeeping are torchft's: a
    step commits only when every rank's cross-group process group (``pg``) and manager saw
    no error and the quorum has ``min_replica_size`` groups; on commit the step and
    committed batches advance, otherwise the consecutive failures count (the lighthouse
    regroups on them); the heal checkpoint stops being served. Different groups may decide
    differently, as with torchft. A vote that cannot complete is one line, not a traceback.
    ``participants``: groups in the step's quorum (torchft's ``num_participants()``)."""

    def __init__(
        self, manager: Any, pg: Any, options: FTOptions, bad_here: bool, participants: int
    ) -> None:
        from torchft.utils import synchronize

        if torch.accelerator.is_available():  # errors of queued device work show only after it
            synchronize()
        if (error := pg.errored()) is not None:
            manager.report_error(error)
        here = participants >= options.min_replica_size and manager.errored() is None
        self._flags = torch.tensor(
            [0 if here else 1, 1 if bad_here else 0], dtype=torch.int32, device=flag_device()
        )
        self._manager, self._options, self._participants = manager, options, participants
        self._work: Any = None
        try:
            self._work = dist.all_reduce(self._flags, async_op=True)
        except Exception as error:
            self._failed = error

    def land(self) -> tuple[bool, bool]:
        """Wait for the vote; returns ``(committed, some rank of this group holds a
        non-finite value)``."""
        try:
            if self._work is None:
                raise self._failed
            self._work.wait()
        except Exception as error:
            raise FaultToleranceError(
                f"group {self._options.replica_id}: commit vote failed (a rank of this group "
                f"was lost?): {type(error).__name__}: "
                f"{str(error).splitlines()[0] if str(error) else ''}"
            ) from None
        cannot, bad = self._flags.tolist()  # one read of the result
        committed, group_bad = cannot == 0, bad > 0
        manager, participants = self._manager, self._participants
        manager._checkpoint_transport.disallow_checkpoint()
        if committed:
            manager._step += 1
            manager._batches_committed += participants
            manager._commit_failures = 0
        else:
            manager._commit_failures += 1
        return committed, group_bad
