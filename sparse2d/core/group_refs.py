"""After ``close()``: no object a model holds keeps its destroyed process groups alive.

A gloo group's threads end only when its last Python reference goes, and a closed model
references its groups from about forty places inside reference cycles. ``close()`` walks the
objects reachable from the model (never modules, classes, code, frames or globals) and puts a
``ClosedGroup`` where a destroyed group was; its error names the closed model (the measurement:
docs/reliability.md).
"""

from __future__ import annotations

import gc
import types
from collections.abc import Callable
from typing import Any

from sparse2d.errors import ClosedError

_LEAVES = (types.ModuleType, type, types.FrameType, types.CodeType, str, bytes, int, float)
"""Never entered: the walk would leave the model (modules, classes, code) or find nothing."""


class ClosedGroup:
    """Stands where a closed model's destroyed process group was referenced."""

    def __init__(self, name: str, owner: str) -> None:
        self.group_name = name
        self.owner = owner

    def __repr__(self) -> str:
        return f"<process group {self.group_name} of a closed {self.owner}>"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise ClosedError(
            f"process group {self.group_name} belonged to a {self.owner} that was closed (its "
            f"process groups are destroyed); cannot use .{name}. Build a new {self.owner}."
        )


def drop_references(root: object, targets: list[Any], replace: Callable[[Any], object]) -> int:
    """Replace every reference to ``targets`` in the objects reachable from ``root`` by
    ``replace(target)`` (one replacement per target); return how many were replaced.

    Reached: dict values and keys, list items, set members, cells, instance attributes
    (``__dict__`` and slots); a tuple holding a target is rebuilt in its holder. A target
    held only inside a C++ object is out of reach (none in TorchRec 1.8/1.9)."""
    if not targets:
        return 0
    swap = {id(t): replace(t) for t in targets}
    replaced = 0
    seen: set[int] = set()
    stack: list[object] = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        replaced += _replace_in(obj, swap)
        stack.extend(k for k in _referents(obj) if id(k) not in seen and not _is_leaf(k))
    return replaced


def _is_leaf(obj: object) -> bool:
    return obj is None or isinstance(obj, _LEAVES)


def _referents(obj: object) -> list[object]:
    if isinstance(obj, types.FunctionType):  # not __globals__: that is the whole module
        return [*(obj.__closure__ or ()), obj.__defaults__, obj.__kwdefaults__, obj.__dict__]
    found = gc.get_referents(obj)
    attrs = None if isinstance(obj, _LEAVES) else _attr(obj, "__dict__")
    return [*found, attrs] if isinstance(attrs, dict) else found


def _attr(obj: object, name: str) -> object:
    try:  # a weakref proxy of a dead object raises ReferenceError
        return getattr(obj, name, None)
    except Exception:
        return None


def _swapped(value: object, swap: dict[int, object]) -> object | None:
    """The replacement of ``value`` (a target, or a tuple holding one), else ``None``."""
    new = swap.get(id(value))
    if new is not None:
        return new
    if isinstance(value, tuple):
        items = [_swapped(v, swap) for v in value]
        if any(i is not None for i in items):
            kept = [v if i is None else i for v, i in zip(value, items)]
            return type(value)._make(kept) if hasattr(value, "_make") else tuple(kept)
    return None


def _replace_in(obj: object, swap: dict[int, object]) -> int:
    if isinstance(obj, dict):
        return _replace_in_dict(obj, swap)
    count = 0
    if isinstance(obj, list):
        for index, value in enumerate(obj):
            if (new := _swapped(value, swap)) is not None:
                obj[index] = new
                count += 1
    elif isinstance(obj, set):
        for value in [v for v in obj if _swapped(v, swap) is not None]:
            obj.discard(value)
            obj.add(_swapped(value, swap))
            count += 1
    elif isinstance(obj, types.CellType):
        try:
            new = _swapped(obj.cell_contents, swap)
        except ValueError:  # an empty cell
            new = None
        if new is not None:
            obj.cell_contents = new
            count += 1
    elif not isinstance(obj, (tuple, frozenset, *_LEAVES)):
        for cls in type(obj).__mro__:  # slots (frozen dataclasses too)
            for slot in _slots(cls):
                value = _attr(obj, slot)
                if (new := _swapped(value, swap)) is not None:
                    object.__setattr__(obj, slot, new)
                    count += 1
    return count


def _replace_in_dict(obj: dict[Any, Any], swap: dict[int, object]) -> int:
    count = 0
    for key, value in list(obj.items()):
        if (new := _swapped(value, swap)) is not None:
            obj[key] = new
            count += 1
        if (new_key := _swapped(key, swap)) is not None:
            obj[new_key] = obj.pop(key)
            count += 1
    return count


def _slots(cls: type) -> list[str]:
    slots = cls.__dict__.get("__slots__", ())
    names = [slots] if isinstance(slots, str) else list(slots)
    return [n for n in names if n not in ("__dict__", "__weakref__")]
