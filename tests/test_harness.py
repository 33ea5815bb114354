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


def check_named_thread(name: str) -> int:
    """Start a thread called ``name`` that lives until released; return the rank's count."""
    import threading

    from tests.harness import thread_count

    release = threading.Event()
    threading.Thread(target=release.wait, name=name, daemon=True).start()
    _HELD.append(release)
    return thread_count()


def check_release_named_threads() -> None:
    while _HELD:
        _HELD.pop().set()


_HELD: list = []


def test_thread_names_show_what_a_leak_is_made_of(world2: DistWorld) -> None:
    """A leak report lists each rank's threads by name, read from outside the ranks. Native
    threads carry their own names (gloo's ``gloo_tcp_loop`` and ``pt_gloo_runloop``, CUDA's);
    a Python thread carries the process's, so the one a check left counts there."""
    before = world2.thread_names()
    try:
        world2.run(check_named_thread, "sparse2d-leak-probe")
        after = world2.thread_names()
    finally:
        world2.run(check_release_named_threads)
    for rank in range(2):
        assert after[rank]["gloo_tcp_loop"] >= 1  # the world's own process group
        grown = {k: n - before[rank].get(k, 0) for k, n in after[rank].items()}
        assert any(grown.get(k, 0) >= 1 for k in ("python", "python3", "sparse2d-leak-p")), grown


_GROUPS: list = []


def check_make_group_and_keep_it() -> list[str]:
    from tests.harness import live_groups

    _GROUPS.append(dist.new_group([0, 1], backend="gloo"))
    return live_groups()


def check_destroy_kept_groups() -> list[str]:
    from tests.harness import live_groups

    while _GROUPS:
        dist.destroy_process_group(_GROUPS.pop())
    return live_groups()


def test_a_leak_report_names_the_code_that_made_each_live_group(world2: DistWorld) -> None:
    """The leak report's second half: every live group with the project frames that made it,
    so a group left alive names its maker (here this module's check)."""
    made = world2.run(check_make_group_and_keep_it)
    after = world2.run(check_destroy_kept_groups)
    for rank in range(2):
        ours = [g for g in made[rank] if "check_make_group_and_keep_it" in g]
        assert len(ours) == 1 and "ranks=[0, 1]" in ours[0], made[rank]
        assert not [g for g in after[rank] if "check_make_group_and_keep_it" in g], after[rank]
