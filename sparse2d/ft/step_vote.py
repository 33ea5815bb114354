"""What a fault-tolerant step votes with: the control vector and the group's commit vote.

Each group adds its plan fingerprint and its NaN/inf flag to the step's cross-group average
(``FaultTolerance.finish_step``): a group with another plan, or a bad value anywhere, is
seen by every group from the average alone, with no collective of its own. Then the ranks of
each group agree whether the step commits (``GroupVote``), and whether some rank of the
group found a non-finite value (the whole group then stops and restarts as one). Both are
ballots (``sparse2d.sync.ballot``): ``CONTROL`` carried by the step's all-reduce, ``GROUP``
by one all-reduce of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from sparse2d.comm_device import flag_device
from sparse2d.errors import FaultToleranceError
from sparse2d.ft.ft_options import FTOptions
from sparse2d.sync.ballot import Ballot, Counting, Flag, Meaning, Tally
from sparse2d.sync.guard import NON_FINITE, all_finite

FINGERPRINT_BYTES = 6
"""``heal_state.fingerprint`` is a 48-bit hash; it travels as 6 bytes and their squares."""

DIGITS = tuple(Flag(f"byte{i}", Meaning.SUM) for i in range(FINGERPRINT_BYTES))
SQUARES = tuple(Flag(f"square{i}", Meaning.SUM) for i in range(FINGERPRINT_BYTES))
CONTROL = Ballot(*DIGITS, *SQUARES, NON_FINITE)
"""The control vector: the fingerprint's bytes ``b``, their squares ``b*b`` (sums exact
enough to round back for < 128 groups) and the NaN/inf flag, last: it ends its dtype's send
buffer, where ``SentScan`` sets it."""


def _digits(fingerprint: int) -> list[int]:
    return [(fingerprint >> (8 * i)) & 0xFF for i in range(FINGERPRINT_BYTES)]


def control_vector(fingerprint: int, bad: bool, grads: list[torch.Tensor]) -> torch.Tensor:
    """The step's ``CONTROL`` ballot, fp32 (or fp64 beside fp64 gradients) so that it rides
    the gradients' all-reduce."""
    marks: dict[str, float] = {NON_FINITE.name: bad}
    for digit, byte, square in zip(_digits(fingerprint), DIGITS, SQUARES, strict=True):
        marks[byte.name], marks[square.name] = digit, digit * digit
    device = grads[0].device if grads else None  # beside the gradients it is sent with
    return CONTROL.encode(marks, dtype=control_dtype(grads), device=device)


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
            CONTROL.mark(control, NON_FINITE)
        return control


def control_dtype(grads: list[torch.Tensor]) -> torch.dtype:
    """fp64 beside fp64 gradients, else fp32 (bf16/fp16 would round ``b*b``)."""
    return torch.float64 if grads and grads[0].dtype == torch.float64 else torch.float32


def read_control(control: torch.Tensor | Sequence[float], groups: int) -> Tally:
    """The quorum's average of the control vector (or its ``tolist()``), read once: one
    device read, no tensor ops on the step's path; sums are the average times ``groups``."""
    return CONTROL.read(control, ranks=groups, scale=groups)


def fingerprints_differ(
    control: torch.Tensor | Sequence[float] | Tally, fingerprint: int, groups: int
) -> bool:
    """Whether some group in the quorum has another fingerprint: the sums of the bytes ``b``
    and squares ``b*b`` equal ``n*b`` and ``n*b*b`` for every byte exactly when every group
    sent the same ``b`` (equality in Cauchy-Schwarz). ``control``: the average over the
    ``groups`` groups in the quorum, or ``read_control``'s tally of it."""
    tally = control if isinstance(control, Tally) else read_control(control, groups)
    n = groups
    for digit, byte, square in zip(_digits(fingerprint), DIGITS, SQUARES, strict=True):
        if tally[byte] != n * digit or tally[square] != n * digit * digit:
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
        self.bad = bool(read_control(control, 1)[NON_FINITE]) if bad is None else bad
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
                    CONTROL.mark(flat[flat.numel() - CONTROL.size :], NON_FINITE)


MANAGER_FIELDS = (
    "_step",
    "_batches_committed",
    "_commit_failures",
    "_checkpoint_transport",
    "_errored",
)
"""What torchft 0.2's ``Manager.should_commit`` updates after its vote RPC (``GroupVote.land``
does the same after its all-reduce), and its error, which ``FaultTolerance.land`` clears after
a late failed commit; ``tests/test_ft_step_vote.py`` fails if a release renames them."""


CANNOT_COMMIT = Flag("cannot_commit")
"""This rank's cross-group process group or manager saw an error, or the quorum is short."""
CUT_OFF = Flag("cut_off")
"""This rank's cross-group all-reduce failed: a peer of the quorum is lost or cut off, and no
rank of this group waits for its commit echo (``QuorumLease.after_vote``)."""
GROUP = Ballot(CANNOT_COMMIT, NON_FINITE, CUT_OFF)
"""The group's commit vote."""


class GroupVote:
    """The commit vote of this group's ranks: torchft's ``Manager.should_commit`` with its
    RPC (every rank to the group's manager server and back) replaced by one SUM all-reduce
    over this torchrun world, which is the group, of each rank's ``GROUP`` ballot ("cannot
    commit", "non-finite here"). Started as soon as the step's cross-group all-reduce landed;
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
        self,
        manager: Any,
        pg: Any,
        options: FTOptions,
        bad_here: bool,
        participants: int,
        cut_off: bool = False,
    ) -> None:
        from torchft.utils import synchronize

        if torch.accelerator.is_available():  # errors of queued device work show only after it
            synchronize()
        if (error := pg.errored()) is not None:
            manager.report_error(error)
        here = participants >= options.min_replica_size and manager.errored() is None
        marks = {CANNOT_COMMIT.name: not here, NON_FINITE.name: bad_here, CUT_OFF.name: cut_off}
        self._manager, self._options, self._participants = manager, options, participants
        self._counting: Counting | None = None
        try:  # over this torchrun world, the group
            self._counting = GROUP.start(marks, None, device=flag_device())
        except Exception as error:
            self._failed = error

    def land(self) -> tuple[bool, bool, bool]:
        """Wait for the vote; returns ``(committed, some rank of this group holds a
        non-finite value, some rank's cross-group all-reduce failed)``."""
        try:
            if self._counting is None:
                raise self._failed
            tally = self._counting.wait()  # one read of the result
        except Exception as error:
            raise FaultToleranceError(
                f"group {self._options.replica_id}: commit vote failed (a rank of this group "
                f"was lost?): {type(error).__name__}: "
                f"{str(error).splitlines()[0] if str(error) else ''}"
            ) from None
        committed, group_bad = not tally[CANNOT_COMMIT], bool(tally[NON_FINITE])
        cut_off = bool(tally[CUT_OFF])
        manager, participants = self._manager, self._participants
        manager._checkpoint_transport.disallow_checkpoint()
        if committed:
            manager._step += 1
            manager._batches_committed += participants
            manager._commit_failures = 0
        else:
            manager._commit_failures += 1
        return committed, group_bad, cut_off
