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
    finally:
        world.close()
