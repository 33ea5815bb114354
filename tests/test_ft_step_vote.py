"""``sparse2d.ft.step_vote``: the control vector tells every group, from the step's average alone,
whether some group runs another plan (fingerprint) or found a non-finite value."""

from __future__ import annotations

import torch
from torch._utils import _flatten_dense_tensors

from sparse2d.ft.step_vote import (
    FINGERPRINT_BYTES,
    ControlVectors,
    SentScan,
    control_vector,
    fingerprints_differ,
)
from sparse2d.sync.shards import by_dtype

A, B = 0x123456789ABC, 0x123456789ABD  # one byte apart: the closest two plans can be


def _average(vectors: list[torch.Tensor]) -> torch.Tensor:
    """What torchft's AVG all-reduce leaves in every group."""
    return torch.stack(vectors).sum(0) / len(vectors)


def test_same_fingerprints_agree_and_any_other_is_seen_by_every_group() -> None:
    for groups in (1, 2, 3, 127):
        same = _average([control_vector(A, False, []) for _ in range(groups)])
        assert not fingerprints_differ(same, A, groups), groups
        assert float(same[-1]) == 0.0
    for groups in (2, 3, 127):
        mixed = _average(
            [control_vector(B, False, [])] + [control_vector(A, False, [])] * (groups - 1)
        )
        assert fingerprints_differ(mixed, A, groups) and fingerprints_differ(mixed, B, groups)
    # the same byte sums with other bytes: 1+3 == 2+2, caught by the squares
    c, d, e = (0x01, 0x03, 0x02)
    pair = _average([control_vector(c, False, []), control_vector(d, False, [])])
    assert fingerprints_differ(pair, e, 2)


def test_non_finite_flag_and_dtype() -> None:
    one_bad = _average([control_vector(A, True, []), control_vector(A, False, [])])
    assert float(one_bad[-1]) > 0 and not fingerprints_differ(one_bad, A, 2)
    wide = control_vector(A, False, [torch.zeros(2, dtype=torch.float64)])
    assert wide.dtype == torch.float64 and control_vector(A, False, []).dtype == torch.float32
    assert wide.numel() == 2 * FINGERPRINT_BYTES + 1


def test_the_step_copy_equals_a_fresh_vector_and_is_read_as_a_list() -> None:
    """``ControlVectors.build`` (what a step sends) is ``control_vector``'s value, a new tensor
    each step (the all-reduce averages it in place), rebuilt when the gradients' dtype
    changes; ``fingerprints_differ`` reads the average's ``tolist()`` as it reads the tensor."""
    controls = ControlVectors(A)
    narrow = [torch.zeros(3)]
    for bad in (False, True, False):
        sent = controls.build(narrow, bad)
        torch.testing.assert_close(sent, control_vector(A, bad, narrow), rtol=0, atol=0)
        sent.add_(7.0)  # averaged in place: the next step's copy is untouched
    wide = controls.build([torch.zeros(2, dtype=torch.float64)], False)
    assert wide.dtype == torch.float64
    mixed = _average([control_vector(B, False, []), control_vector(A, True, [])])
    for read in (mixed, mixed.tolist()):
        assert fingerprints_differ(read, A, 2) and fingerprints_differ(read, B, 2)
    same = _average([control_vector(A, False, []), control_vector(A, False, [])])
    assert not fingerprints_differ(same.tolist(), A, 2)


def test_torchft_manager_keeps_the_fields_the_group_vote_updates() -> None:
    """``GroupVote.land`` does what torchft 0.2's ``Manager.should_commit`` does after its RPC;
    a torchft release that renames these fields must fail here, not train on a stale step."""
    import inspect

    from torchft.manager import Manager

    from sparse2d.ft.step_vote import MANAGER_FIELDS

    source = inspect.getsource(Manager.should_commit) + inspect.getsource(Manager.__init__)
    for field in MANAGER_FIELDS:
        assert f"self.{field}" in source, field
    assert "disallow_checkpoint()" in inspect.getsource(Manager.should_commit)


def _sent(tensors: list[torch.Tensor], scan: SentScan) -> list[torch.Tensor]:
    """The buffers ``ManagedChannel._send`` sends for ``tensors`` (one per dtype, a single
    tensor as itself), after ``scan`` saw them (its ``before_send``)."""
    groups = by_dtype(tensors).values()
    flats = [g[0] if len(g) == 1 else _flatten_dense_tensors(g) for g in groups]
    scan(flats)
    return flats


def test_sent_scan_finds_a_bad_value_anywhere_in_the_buffers_and_flags_the_control() -> None:
    """One sum per sent buffer finds a NaN/inf in any gradient or queued copy, and the flag
    lands in the control vector's slot (the end of its dtype's buffer), nowhere else."""
    copies = [torch.ones(50), torch.ones(7, dtype=torch.float64)]  # the sync's queued copies
    for where, bad in [(None, None), (0, float("nan")), (2, float("inf")), (3, -float("inf"))]:
        grads = [torch.ones(4, 3), torch.ones(5), torch.ones(2)]
        tensors = [*copies, *grads]
        if where is not None:
            tensors[where].view(-1)[1] = bad
        control = control_vector(A, False, grads)
        scan = SentScan(control, grads, scan_sent=True, aside=[])
        flats = _sent([*tensors, control], scan)
        fp32 = next(f for f in flats if f.dtype == torch.float32)
        assert scan.bad == (where is not None) and float(fp32[-1]) == float(scan.bad), where
        wide = next(f for f in flats if f.dtype == torch.float64)
        assert torch.equal(wide, torch.ones(7, dtype=torch.float64)), where  # no flag there


def test_sent_scan_without_check_finite_scans_gradients_only_and_aside_values_live() -> None:
    copies, grads = [torch.full((3,), float("nan"))], [torch.ones(2)]
    off = SentScan(control_vector(A, False, grads), grads, scan_sent=False, aside=[])
    _sent([*copies, *grads, off.control], off)
    assert not off.bad  # check_finite off: the sync's values are not scanned
    grads[0][0] = float("inf")
    assert SentScan(control_vector(A, False, grads), grads, scan_sent=False, aside=[]).bad
    rows = [torch.ones(4), torch.tensor([1.0, float("nan")])]  # e.g. MC rows, sent aside
    control = control_vector(A, False, [torch.ones(1, dtype=torch.float64)])  # alone in fp32
    aside = SentScan(control, [], scan_sent=True, aside=rows)
    assert aside.bad
    (flat,) = _sent([control], aside)
    assert flat is control and float(control[-1]) == 1.0
