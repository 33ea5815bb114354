"""Ownership of what a ``DMPCollection`` creates: process groups, hooks, in-flight work.

Every idle gloo group busy-polls (bench/RESULTS.md, section resources), so a model must
release its own. ``GroupRecorder`` notes the groups registered while a block runs, so exactly
those are destroyed at ``close()``; ``Resources`` runs release callbacks in reverse order,
once. Destroying a group is local (no collective), so ``close()`` never hangs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from sparse2d.errors import ClosedError


def registered_groups() -> list[dist.ProcessGroup]:
    """Process groups this rank is a member of, in creation order (the default one first)."""
    return list(c10d._world.pg_names)


class GroupRecorder:
    """Records the process groups created inside ``with recorder.recording():`` blocks."""

    def __init__(self, on_destroyed: Callable[[], object] | None = None) -> None:
        self.groups: list[dist.ProcessGroup] = []
        self.on_destroyed = on_destroyed
        """Runs after ``destroy``: drops references that caches elsewhere keep to the groups
        (a group's threads end only when its last reference does)."""

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        before = {id(g) for g in registered_groups()}
        try:
            yield
        finally:
            for group in registered_groups():
                if id(group) not in before and group not in self.groups:
                    self.groups.append(group)

    def destroy(self) -> int:
        """Destroy the recorded groups still registered (newest first); return how many."""
        live = {id(g) for g in registered_groups()}
        destroyed = 0
        protected = {id(dist.group.WORLD)} if dist.is_initialized() else set()
        for group in reversed(self.groups):
            if id(group) in live and id(group) not in protected:
                dist.destroy_process_group(group)
                destroyed += 1
        self.groups.clear()
        if self.on_destroyed is not None:
            self.on_destroyed()
        return destroyed


class Resources:
    """Release callbacks run once, newest first; ``check_open`` guards use after close."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.closed = False
        self._stack = contextlib.ExitStack()

    def callback(self, release: Callable[[], object]) -> None:
        self._stack.callback(release)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._stack.close()

    def check_open(self, action: str) -> None:
        if self.closed:
            raise ClosedError(
                f"{self.owner} was closed (its process groups are destroyed); cannot {action}. "
                f"Build a new {self.owner} to train again."
            )
