"""``sparse2d.sync.ballot``: a flag set on one rank is seen on every rank through each
carrier (the ballot's own all-reduce over a given group; appended to a buffer another
all-reduce sends, whose other values come back as they would alone), read by its meaning."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.distributed as dist

from sparse2d.sync.ballot import Ballot, Flag, Meaning

BAD = Flag("bad")
ALL_IN = Flag("all_in", Meaning.ALL)
COUNT = Flag("count", Meaning.SUM)
BALLOT = Ballot(BAD, ALL_IN, COUNT)


def _marks(rank: int, flagged: int) -> dict[str, float]:
    """Rank ``flagged`` is bad; every rank is in; each rank counts ``rank + 1``."""
    return {BAD.name: rank == flagged, ALL_IN.name: 1, COUNT.name: rank + 1}


@contextmanager
def _counted() -> Iterator[list[str]]:
    """Every ``dist.all_reduce`` made while inside (what a carrier must not add to)."""
    calls: list[str] = []
    original = dist.all_reduce

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append("all_reduce")
        return original(*args, **kwargs)

    dist.all_reduce = counting  # type: ignore[assignment]
    try:
        yield calls
    finally:
        dist.all_reduce = original  # type: ignore[assignment]


def check_own_all_reduce(flagged: int) -> dict:
    """``Ballot.start`` over the world and over this rank's pair (a given group): one
    all-reduce each, the totals alike on every rank of the group."""
    rank, world = dist.get_rank(), dist.get_world_size()
    pairs = [dist.new_group([r, r + 1]) for r in range(0, world, 2)]
    try:
        with _counted() as calls:
            tally = BALLOT.start(_marks(rank, flagged), None).wait()
            pair = BALLOT.start(_marks(rank, flagged), pairs[rank // 2]).wait()
        return {
            "calls": len(calls),
            "world": [tally[BAD], tally[ALL_IN], tally[COUNT]],
            "pair": [pair[BAD], pair[ALL_IN], pair[COUNT]],
        }
    finally:
        for group in pairs:
            dist.destroy_process_group(group)


@pytest.mark.parametrize("flagged", [0, 3])
def test_own_all_reduce_tells_every_rank_of_its_group(world4, flagged: int) -> None:
    results = world4.run(check_own_all_reduce, flagged)
    for rank, result in enumerate(results):
        assert result["calls"] == 2
        assert result["world"] == [True, True, 1 + 2 + 3 + 4]
        first = rank - rank % 2
        assert result["pair"] == [flagged // 2 == rank // 2, True, (first + 1) + (first + 2)]


def check_copies_in_one_all_reduce(flagged: int) -> dict:
    """``Ballot.start_each``: one copy per mapping (a vote per buffer), one all-reduce, read
    in order by ``wait_each``; ``wait`` refuses several copies."""
    rank = dist.get_rank()
    with _counted() as calls:
        counting = BALLOT.start_each([_marks(rank, flagged), _marks(rank, -1)], None)
        first, second = counting.wait_each()
    two = BALLOT.start_each([{}, {}], None)
    try:
        two.wait()
        refused = ""
    except RuntimeError as error:
        refused = str(error)
    two.wait_each()  # the all-reduce itself went out on every rank: land it
    return {
        "calls": len(calls),
        "first": [first[BAD], first[ALL_IN], first[COUNT]],
        "second": [second[BAD], second[ALL_IN], second[COUNT]],
        "refused": refused,
    }


def test_copies_travel_in_one_all_reduce(world4) -> None:
    for result in world4.run(check_copies_in_one_all_reduce, 2):
        assert result["calls"] == 1
        assert result["first"] == [True, True, 10]
        assert result["second"] == [False, True, 10]
        assert "wait_each" in result["refused"]


def check_carried(dtype: torch.dtype, average: bool) -> dict:
    """Two copies of the ballot appended to a buffer of data that the one all-reduce sends
    anyway (SUM as DDP's bucket, or AVG as torchft's step: ``scale`` undoes it); the data
    come back as a reduction of the data alone leaves them."""
    rank, world = dist.get_rank(), dist.get_world_size()
    data = torch.arange(5, dtype=dtype) + 8 * rank
    flat = torch.empty(5 + 2 * BALLOT.size, dtype=dtype)
    flat[:5] = data
    BALLOT.encode(_marks(rank, 1), _marks(rank, -1), out=flat[5:])
    op = dist.ReduceOp.AVG if average else dist.ReduceOp.SUM
    alone = data.clone()
    dist.all_reduce(alone, op=op)
    with _counted() as calls:
        dist.all_reduce(flat, op=op)
        first, second = BALLOT.read_each(flat[5:], 2, ranks=world, scale=world if average else 1.0)
    return {
        "calls": len(calls),
        "data": torch.equal(flat[:5], alone),
        "first": [first[BAD], first[ALL_IN], first[COUNT]],
        "second": [second[BAD], second[ALL_IN], second[COUNT]],
    }


@pytest.mark.parametrize(
    ("dtype", "average"),
    [(torch.float32, False), (torch.bfloat16, False), (torch.float64, True), (torch.int64, False)],
)
def test_carried_in_another_all_reduce_adds_none_and_keeps_the_data(
    world2, dtype: torch.dtype, average: bool
) -> None:
    for result in world2.run(check_carried, dtype, average):
        assert result["calls"] == 1  # the buffer's own: the ballot added nothing
        assert result["data"]
        assert result["first"] == [True, True, 3]  # rank 1 flagged
        assert result["second"] == [False, True, 3]  # nobody flagged


def check_all_set_by_some(average: bool) -> dict:
    """``ALL_IN`` set on ranks 0 and 2 of 4 (and then on every rank), through the ballot's
    own all-reduce and carried in another (SUM, and AVG undone by ``scale``): "every rank"
    must read False while any rank left it unset, whatever the total."""
    rank, world = dist.get_rank(), dist.get_world_size()
    some = {ALL_IN.name: rank % 2 == 0}
    own = [BALLOT.start(marks, None).wait()[ALL_IN] for marks in (some, {ALL_IN.name: 1})]
    flat = BALLOT.encode(some, {ALL_IN.name: 1}, dtype=torch.float64)
    op = dist.ReduceOp.AVG if average else dist.ReduceOp.SUM
    dist.all_reduce(flat, op=op)
    tallies = BALLOT.read_each(flat, 2, ranks=world, scale=world if average else 1.0)
    return {"own": own, "carried": [t[ALL_IN] for t in tallies]}


@pytest.mark.parametrize("average", [False, True])
def test_every_rank_means_every_rank_not_some(world4, average: bool) -> None:
    for result in world4.run(check_all_set_by_some, average):
        assert result["own"] == [False, True]
        assert result["carried"] == [False, True]


def test_encode_read_and_mark_on_one_rank() -> None:
    slot = BALLOT.encode({COUNT.name: 2}, dtype=torch.float16)
    assert slot.tolist() == [0.0, 0.0, 2.0]
    BALLOT.mark(slot, BAD)
    one = BALLOT.read(slot, ranks=1)
    assert [one[BAD], one[ALL_IN], one[COUNT.name]] == [True, False, 2]
    twice = torch.zeros(2 * BALLOT.size, dtype=torch.int32)
    BALLOT.mark(twice, ALL_IN, copy=1)
    assert twice.tolist() == [0, 0, 0, 0, 1, 0]
    # what an average over 3 ranks leaves (one of them flagged): no rounding loses the vote
    avg = BALLOT.read([1 / 3, 1.0, 7 / 3], ranks=3, scale=3)
    assert [avg[BAD], avg[ALL_IN], avg[COUNT]] == [True, True, 7]


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: BALLOT.encode({"typo": 1}), KeyError),
        (lambda: BALLOT.read([0.0, 1.0], ranks=1), RuntimeError),
        (lambda: Ballot(BAD, Flag("bad", Meaning.SUM)), RuntimeError),
    ],
)
def test_misuse_is_refused(call: Callable[[], Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        call()
