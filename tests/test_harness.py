"""``tests.harness``: a hung check fails in its time, names the ranks, and the world recovers."""

from __future__ import annotations

import time

import pytest
import torch.distributed as dist

from tests.harness import CheckFailed, DistWorld


def check_rank_one_hangs() -> int:
    if dist.get_rank() == 1:
        time.sleep(60)
    return dist.get_rank()


def check_rank() -> int:
    return dist.get_rank()


def check_rank_zero_raises_and_rank_one_waits() -> None:
    if dist.get_rank() == 0:
        raise ValueError("the plan failed on rank 0")
    time.sleep(60)  # as a rank waiting for rank 0's broadcast would


def test_a_hung_rank_fails_the_check_and_the_world_restarts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = DistWorld(2)
    try:
        monkeypatch.setenv("SPARSE2D_TEST_CHECK_S", "3")  # caps the 240 s default
        start = time.monotonic()
        with pytest.raises(CheckFailed, match=r"did not finish on ranks \[1\] within 3.0s"):
            world.run(check_rank_one_hangs)
        assert time.monotonic() - start < 30  # 3 s, the stack dump's 2 s, the restart
        assert world.run(check_rank) == [0, 1]  # the restarted world works
        # The hang report carries the error of the rank that raised before the others hung.
        with pytest.raises(CheckFailed, match=r"(?s)ranks \[1\].*rank 0 raised.*plan failed"):
            world.run(check_rank_zero_raises_and_rank_one_waits)
    finally:
        world.close()
