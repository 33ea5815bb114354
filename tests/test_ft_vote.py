"""``sparse2d.ft.vote``: the control vector tells every group, from the step's average alone,
whether some group runs another plan (fingerprint) or found a non-finite value."""

from __future__ import annotations

import torch

from sparse2d.ft.vote import FINGERPRINT_BYTES, control_vector, fingerprints_differ

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


def test_torchft_manager_keeps_the_fields_group_commit_updates() -> None:
    """``group_commit`` does what torchft 0.2's ``Manager.should_commit`` does after its RPC;
    a torchft release that renames these fields must fail here, not train on a stale step."""
    import inspect

    from torchft.manager import Manager

    from sparse2d.ft.vote import MANAGER_FIELDS

    source = inspect.getsource(Manager.should_commit) + inspect.getsource(Manager.__init__)
    for field in MANAGER_FIELDS:
        assert f"self.{field}" in source, field
    assert "disallow_checkpoint()" in inspect.getsource(Manager.should_commit)
