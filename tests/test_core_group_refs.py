"""``close()`` releases a model's process groups at once (``sparse2d/core/group_refs.py``).

The acceptance case of issue 34: 20 constructions + ``close()`` in a plain loop, world 4,
with the garbage collector off (no ``gc.collect()``, nothing frozen by the loop): threads
(``/proc/self/task``: gloo's C++ threads too) and open sockets are back where they started,
while the last model is still referenced. Before the fix: 6 -> 171 threads and 10 -> 110
sockets on rank 0.
"""

from __future__ import annotations

import functools
import gc
import types
from collections import namedtuple
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist

from sparse2d.core.group_refs import ClosedGroup, drop_references
from sparse2d.errors import ClosedError
from tests.harness import thread_count
from tests.models import MIXED_TABLES, train
from tests.test_core_resources import VARIANTS, build_variant, open_sockets

ROUNDS = 20


def check_loop_releases_without_gc() -> dict:
    start = (thread_count(), open_sockets())
    enabled = gc.isenabled()
    gc.disable()
    try:
        for index in range(ROUNDS):  # every variant: TWRW pair, FULLY_SHARDED, two meshes, hide
            variant = VARIANTS[index % len(VARIANTS)]
            model = build_variant(variant)
            if variant in ("hidden_sync", "fully_sharded"):
                train(model, MIXED_TABLES, 2, after_step=model.maybe_sync)
            model.close()
        end = (thread_count(), open_sockets())  # ``model`` still holds the last one
    finally:
        if enabled:
            gc.enable()
    model.close()  # a second close does nothing
    refused = []
    for call in (lambda: model.sync(), lambda: train(model, MIXED_TABLES, 1)):
        try:
            call()
        except ClosedError as error:
            refused.append(str(error))
    ones = torch.ones(1)
    dist.all_reduce(ones)  # the default group was not destroyed
    return {"start": start, "end": end, "refused": refused, "sum": float(ones)}


def test_twenty_constructions_release_at_close_without_gc(world4) -> None:
    for rank, result in enumerate(world4.run(check_loop_releases_without_gc, timeout=600)):
        (threads, sockets), (threads_end, sockets_end) = result["start"], result["end"]
        assert threads_end - threads <= 2, f"rank {rank}: threads {threads} -> {threads_end}"
        assert sockets_end <= sockets, f"rank {rank}: sockets {sockets} -> {sockets_end}"
        assert len(result["refused"]) == 2 and all("closed" in e for e in result["refused"])
        assert result["sum"] == 4.0


# ---- the walk, on plain objects ---------------------------------------------------------
class Group:
    group_name = "7"


Pair = namedtuple("Pair", "intra cross")


@dataclass(frozen=True, slots=True)
class Frozen:
    pg: object


def _returning(value: object):  # noqa: ANN202
    return lambda: value


class Holder:
    def __init__(self, pg: object) -> None:
        self.pg = pg


def test_every_kind_of_holder_is_rewritten() -> None:
    pg, other = Group(), Group()
    closure = _returning(pg)  # a cell holding the group
    root = {
        "value": pg,
        pg: "as a key",
        "list": [pg, other],
        "set": {pg},
        "tuple": (1, (pg, Pair(pg, other))),
        "frozen": Frozen(pg),
        "holder": Holder(pg),
        "closure": closure,
        "partial": functools.partial(print, pg),  # in a C object's tuple: out of reach
    }
    replaced = drop_references(root, [pg], lambda g: ClosedGroup(g.group_name, "Thing"))
    placeholder = root["value"]
    assert isinstance(placeholder, ClosedGroup)
    assert root[placeholder] == "as a key" and pg not in root
    assert root["list"] == [placeholder, other] and root["set"] == {placeholder}
    assert root["tuple"] == (1, (placeholder, Pair(placeholder, other)))
    assert type(root["tuple"][1][1]) is Pair
    assert root["frozen"].pg is placeholder and root["holder"].pg is placeholder
    assert closure() is placeholder
    assert replaced == 8


def test_the_walk_stays_out_of_modules_and_globals() -> None:
    pg = Group()
    module = types.ModuleType("elsewhere")
    module.pg = pg  # type: ignore[attr-defined]
    function = types.FunctionType((lambda: None).__code__, {"pg": pg})
    root = [module, function, Holder]
    assert drop_references(root, [pg], lambda g: ClosedGroup("7", "Thing")) == 0
    assert module.pg is pg and function.__globals__["pg"] is pg


def test_placeholder_names_the_closed_owner() -> None:
    closed = ClosedGroup("3", "DMPCollection")
    assert repr(closed) == "<process group 3 of a closed DMPCollection>"
    with pytest.raises(ClosedError, match="group 3 belonged to a DMPCollection.*cannot use .size"):
        closed.size()
    assert not hasattr(closed, "__torch_function__")
