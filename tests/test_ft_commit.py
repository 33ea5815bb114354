"""``sparse2d.ft.commit``: what a step carries between its all-reduce and its commit.

The late vote itself runs in ``tests/test_ft_optim.py`` (no failure: both pipelines equal
TorchRec 1D DMP) and ``tests/test_ft_quorum.py`` (a fault under the lease)."""

from __future__ import annotations

import pytest
import torch

from sparse2d.errors import ConfigError, SyncError
from sparse2d.ft.commit import before_forward, dense_grads, refusal
from sparse2d.ft.ft_options import FTOptions


def test_dense_grads_fill_missing_ones_with_zeros_and_skip_integer_parameters() -> None:
    """Every group sends the same layout: a parameter the step did not touch sends zeros;
    MP-ZCH identity tables (integer parameters, never trained) are not sent."""
    used, unused = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2, 2))
    ids = torch.nn.Parameter(torch.zeros(4, dtype=torch.int64), requires_grad=False)
    used.grad = torch.full((3,), 2.0)
    opt = torch.optim.SGD([used, unused, ids], lr=0.1)
    grads = dense_grads(opt)
    assert [g.shape for g in grads] == [torch.Size([3]), torch.Size([2, 2])]
    assert grads[0] is used.grad and torch.equal(grads[1], torch.zeros(2, 2))
    assert unused.grad is grads[1] and ids.grad is None


def test_refusal_names_the_group_and_the_cause() -> None:
    options = FTOptions(replica_id=3, num_groups=4)
    assert refusal(options, False, False, 0xABC, None) is None
    with_sync = SyncError("guard found inf in table t")
    bad = refusal(options, True, True, 0xABC, with_sync)  # a bad value wins over a mismatch
    assert isinstance(bad, SyncError) and "group 3" in str(bad)
    assert "guard found inf in table t" in str(bad)
    other = refusal(options, False, True, 0xABC, None)
    assert isinstance(other, ConfigError) and "abc" in str(other)


def test_before_forward_lands_late_and_leaves_the_arguments_alone() -> None:
    """A pre-hook that returned the landing's verdict would replace the forward's input."""
    calls: list[dict] = []

    def land(*args: object) -> bool:
        calls.append(args)
        return True

    model = torch.nn.Linear(2, 1)
    model.register_forward_pre_hook(before_forward(land))
    out = model(torch.ones(1, 2))
    assert out.shape == (1, 1) and calls == [()]


if __name__ == "__main__":
    pytest.main([__file__])
