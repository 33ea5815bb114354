"""``SendArena``: the sync's copies are gathered into the step's send buffer and sent where
they are; anything it cannot place exactly goes through a fresh buffer (the caller's)."""

from __future__ import annotations

import torch

from sparse2d.ft.transport import SendArena

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
