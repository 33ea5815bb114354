"""``SendArena``: the sync's copies are gathered into the step's send buffer and sent where
they are; anything it cannot place exactly goes through a fresh buffer (the caller's).
``ManagedChannel``: a cross-group all-reduce whose peer went silent ends ``timeout_s`` after
it started."""

from __future__ import annotations

import datetime
import time
from pathlib import Path

import torch

from sparse2d.ft.lighthouse import start_lighthouse
from sparse2d.ft.transport import MAX_RESERVE_SHARE, REGROUP_S, SendArena, WaitBudget
from tests.ft_groups import run_groups

CPU = torch.device("cpu")


def _step(arena: SendArena, sizes: list[int], tail: list[torch.Tensor]):
    """Take regions of ``sizes`` (the payload), fill them, then place them with ``tail``."""
    regions = [arena.take(("w", i), n, torch.float32, CPU) for i, n in enumerate(sizes)]
    for i, region in enumerate(regions):
        region.fill_(float(i + 1))
    placed = arena.place([*regions, *tail])
    arena.reset()
    return regions, placed


def test_copies_are_sent_in_place_from_the_second_step_with_room_for_the_tail() -> None:
    arena = SendArena()
    grads = [torch.ones(3, 2), torch.ones(4)]
    _, first = _step(arena, [10, 5], grads)
    assert first is None  # the tail's size was unknown when the buffer was cut
    for _ in range(3):
        regions, placed = _step(arena, [10, 5], grads)
        assert placed is not None
        flat, inside = placed
        assert inside == 2 and flat.numel() == 10 + 5 + 10
        assert flat[:10].eq(1).all() and flat[10:15].eq(2).all()  # the regions themselves
        assert regions[0].data_ptr() == flat.data_ptr()
    assert arena.placed == 3


def test_a_forgotten_arena_hands_out_new_buffers() -> None:
    """After an abandoned send (``quorum.drop_process_group``) the next payload must not sit
    in the old buffer, which the abandoned all-reduce may still write into."""
    arena = SendArena()
    grads = [torch.ones(4)]
    _step(arena, [8], grads)
    old, _ = _step(arena, [8], grads)
    arena.forget()
    new, placed = _step(arena, [8], grads)
    assert placed is not None  # still sent in place, with room for the tail it knew
    assert new[0].data_ptr() != old[0].data_ptr()
    assert old[0].eq(1).all()  # the old buffer is left as it was (only dropped)


def test_anything_not_exactly_the_regions_is_not_placed() -> None:
    arena = SendArena()
    grads = [torch.ones(6)]
    _step(arena, [8], grads)
    regions, placed = _step(arena, [8], grads)
    assert placed is not None
    region = arena.take("w", 8, torch.float32, CPU)
    assert arena.place([region.clone(), *grads]) is None  # a copy elsewhere
    arena.reset()
    first, second = arena.take("a", 4, torch.float32, CPU), arena.take("b", 4, torch.float32, CPU)
    assert arena.place([second, first, *grads]) is None  # out of order
    arena.reset()
    first, second = arena.take("a", 4, torch.float32, CPU), arena.take("b", 4, torch.float32, CPU)
    assert arena.place([first, *grads]) is None  # a region handed out but not sent
    arena.reset()
    wide = torch.ones(3, dtype=torch.float64)
    assert arena.place([wide, wide]) is None  # no buffer of that dtype


def test_a_region_taken_before_the_buffer_grew_is_not_placed_and_keeps_its_values() -> None:
    arena = SendArena()
    grads = [torch.ones(2)]
    _step(arena, [4], grads)
    _step(arena, [4], grads)
    small = arena.take("a", 4, torch.float32, CPU)
    small.fill_(7.0)
    big = arena.take("b", 100, torch.float32, CPU)  # the buffer grows: ``small`` stays valid
    assert small.eq(7.0).all() and arena.place([small, big, *grads]) is None
    arena.reset()
    regions, placed = _step(arena, [4, 100], grads)  # the next step fits the grown buffer
    assert placed is not None and placed[1] == 2


def test_a_step_without_copies_sends_its_tail_from_the_buffer() -> None:
    arena = SendArena()
    grads = [torch.ones(5), torch.ones(3)]
    _step(arena, [6], grads)
    _step(arena, [6], grads)
    placed = arena.place(grads)
    assert placed is not None and placed[1] == 0 and placed[0].numel() == 8


def _quorum_channel(group: int, lighthouse: str, timeout_s: float, pg_timeout_s: float = 0):
    """Group ``group`` of two (one rank each) in a real quorum: (its torchft process group,
    its manager, the channel over them). ``pg_timeout_s``: the process group's own gloo
    timeout, set at its setup (0: ``timeout_s``)."""
    from sparse2d.ft.ft_options import FTOptions
    from sparse2d.ft.manager import torchft_manager
    from sparse2d.ft.quorum import form
    from sparse2d.ft.transport import ManagedChannel

    options = FTOptions(
        replica_id=group,
        num_groups=2,
        min_replica_size=2,
        lighthouse=lighthouse,
        timeout_s=timeout_s,
        quorum_timeout_s=60,
    )
    pg, manager = torchft_manager(options, lambda state: None, lambda: {})
    if pg_timeout_s:
        pg.set_timeout(datetime.timedelta(seconds=pg_timeout_s))
    participants = form(manager, options)
    budget = WaitBudget(timeout_s)
    return pg, manager, ManagedChannel(manager, pg, lambda: participants, budget)


def _silent_peer(group: int, lighthouse: str, timeout_s: float, done: str):
    """Two groups of one rank form a real quorum; then group 1 goes silent (its link cut) and
    group 0 averages a tensor over the channel. The process group's gloo timeout is 60 s: it
    does not fire within the test, as it did not on a cut link. Group 0 returns (seconds the
    all-reduce held it, whether its manager saw the error) once it wrote ``done`` and group
    1, which waited for it, sent its side (the link is back): no gloo operation stays open."""
    pg, manager, channel = _quorum_channel(group, lighthouse, timeout_s, pg_timeout_s=60)
    healthy = torch.full((4,), float(group))
    channel.start_tensors([healthy])()  # both groups: the channel averages
    assert torch.equal(healthy, torch.full((4,), 0.5)) and manager.errored() is None
    if group == 1:
        _wait_for(Path(done))
        pg.allreduce([torch.ones(4)], torch.distributed.AllreduceOptions()).wait()
        Path(done + ".back").touch()
        return None
    started = time.monotonic()
    channel.start_tensors([torch.ones(4)])()
    out = time.monotonic() - started, manager.errored() is not None
    Path(done).touch()
    _wait_for(Path(done + ".back"))  # group 1's side landed before this process exits
    return out


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 90
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_an_all_reduce_whose_peer_went_silent_ends_its_budget_after_its_start(tmp_path) -> None:
    """The step's cross-group all-reduce is given up its budget (``WaitBudget``: here
    ``timeout_s`` less ``REGROUP_S``, no step measured yet) after it started and the error
    goes to torchft's manager (the step fails its vote), whatever the process group's own
    timeout does: on the emulated cluster a 30 s partition held it until the link was back
    (issue 64)."""
    timeout_s = 2.0
    lighthouse = start_lighthouse(min_replicas=2)
    try:
        args = (lighthouse.address(), timeout_s, str(tmp_path / "done"))
        out = run_groups(2, 1, _silent_peer, *args, timeout=150)
    finally:
        lighthouse.shutdown()
    seconds, errored = out[(0, 0)]
    assert errored
    assert timeout_s - REGROUP_S - 0.02 < seconds < timeout_s + 0.5, seconds


def _late_peer(group: int, lighthouse: str, timeout_s: float, delay_s: float):
    """Two groups of one rank; group 1 joins the second all-reduce ``delay_s`` late. Group 0
    returns whether its manager saw an error (the step would fail its vote)."""
    _, manager, channel = _quorum_channel(group, lighthouse, timeout_s)
    channel.start_tensors([torch.ones(4)])()
    if group == 1:
        time.sleep(delay_s)
    healthy = torch.full((4,), float(group))
    channel.start_tensors([healthy])()
    return manager.errored() is not None


def test_an_all_reduce_done_late_in_its_timeout_fails_the_step() -> None:
    """Done after ``TRUSTED_SHARE`` of ``timeout_s``, an all-reduce fails its step even
    though it completed: a peer that started it earlier may have given up on it at its own
    deadline and committed the step without this group. Done well inside, it commits.
    Breaks if the late rule is removed (the late run then commits)."""
    timeout_s = 4.0
    lighthouse = start_lighthouse(min_replicas=2)
    try:
        late = run_groups(2, 1, _late_peer, lighthouse.address(), timeout_s, 3.5, timeout=150)
        early = run_groups(2, 1, _late_peer, lighthouse.address(), timeout_s, 0.5, timeout=150)
    finally:
        lighthouse.shutdown()
    assert late[(0, 0)] and not early[(0, 0)], (late, early)


def test_the_budget_keeps_two_median_steps_and_the_regroup_out_of_timeout_s() -> None:
    """A survivor still runs up to a step before its all-reduce, waits up to a step for the
    groups whose step started later, regroups and redoes the step: the wait keeps two median
    steps and ``REGROUP_S`` so that the stall is at most ``timeout_s`` plus the redone step.
    A stall among the gaps moves the median by one place, not to the stall; a step longer
    than the cap leaves the peer 90% of ``timeout_s``."""
    budget = WaitBudget(20.0)
    assert budget.seconds() == 20.0 - REGROUP_S  # nothing measured: the regroup alone
    for k in range(10):
        budget.committed(100.0 + 0.04 * k)
    budget.committed(100.0 + 0.04 * 9 + 20.1)  # a partition's stall
    assert abs(budget.step_s - 0.04) < 1e-9, budget.step_s
    assert abs(budget.seconds() - (20.0 - 0.08 - REGROUP_S)) < 1e-9, budget.seconds()
    slow = WaitBudget(20.0)
    for k in range(4):
        slow.committed(5.0 * k)
    assert slow.seconds() == 20.0 * (1 - MAX_RESERVE_SHARE)


def test_a_steps_waits_share_one_budget_from_its_start() -> None:
    """Inside a step every cross-group wait ends one budget after the step began, however
    late it starts (a rank that first waited for its peer in the group's lease agreement
    must not wait a fresh budget toward a cut peer); outside a step a wait counts from its
    own start. Breaks if the deadline counts from each wait's start."""
    budget = WaitBudget(20.0)
    budget.begin_step()
    began = time.monotonic()
    late = budget.counted_from(began + 19.0)  # the all-reduce sent 19 s into the step
    assert abs(late - began) < 0.05, late - began
    budget.end_step()
    assert budget.counted_from(began + 30.0) == began + 30.0
