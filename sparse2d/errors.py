"""Every error sparse2d raises on purpose, in one place; each message names the bad value and the fix.

``Sparse2DError`` is the base, so ``except sparse2d.Sparse2DError`` catches what sparse2d
raised and nothing else. Below it, by cause:

- ``ConfigError`` (also a ``ValueError``): a bad argument, option or config value, found
  before any collective. ``PlanError`` and its kinds are bad plans/group sizes;
  ``KeyValueError`` is one trainer config key; ``NotARunError`` a directory no run wrote.
- ``CheckpointError`` (also a ``ValueError``, as before): a checkpoint that is missing,
  incomplete or does not match the model; ``CorruptCheckpointError`` one whose files are
  damaged. Not a ``ConfigError``: the configuration may be fine while the file is not.
- ``RuntimeError`` kinds, failures while running: ``SyncError`` (non-finite values refused by
  a sync), ``FaultToleranceError`` (no quorum, lighthouse lost), ``CollectiveCallError`` (a
  collective call reached by only some ranks), ``ClosedError`` (used after ``close()``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = [
    "CheckpointError",
    "ClosedError",
    "CollectiveCallError",
    "ConfigError",
    "CorruptCheckpointError",
    "FaultToleranceError",
    "KeyValueError",
    "NoFitError",
    "NotARunError",
    "PlanError",
    "Sparse2DError",
    "StoredPlanError",
    "SyncError",
    "UnsupportedOptimizerError",
]


class Sparse2DError(Exception):
    """The base of every error sparse2d raises on purpose."""


# --- bad input -----------------------------------------------------------------------------


class ConfigError(Sparse2DError, ValueError):
    """A bad argument or configuration value; the message names it and the fix."""


class KeyValueError(ConfigError):
    """A bad value for one trainer config key; ``key`` is relative to the section that raised
    it (the loader prefixes the section, so the final message names the dotted key)."""

    def __init__(self, key: str, detail: str) -> None:
        self.key, self.detail = key, detail
        super().__init__(f"{key}{detail}")


Options = TypeVar("Options", bound=type)


def refuse_retired_keywords(cls: Options) -> Options:
    """``cls(...)`` naming a field of ``cls.retired_keys`` (fields removed after measurement:
    field -> what it was and why it went) raises ``KeyValueError`` with that line instead of
    Python's bare "unexpected keyword argument"; the config loader writes the same line."""
    init = cls.__init__

    @functools.wraps(init)
    def checked(self: Any, *args: Any, **kwargs: Any) -> None:
        for name in kwargs:
            why = cls.retired_keys.get(name)
            if why is not None:
                raise KeyValueError(name, f" was retired: {why}.")
        init(self, *args, **kwargs)

    cls.__init__ = checked
    return cls


class NotARunError(ConfigError):
    """A directory given to ``sparse2d report`` that no trainer run wrote."""


class UnsupportedOptimizerError(ConfigError):
    """A fused embedding optimizer the selected device's kernels cannot run."""


class PlanError(ConfigError):
    """A sharding plan that does not fit the sharding group or the model."""


class StoredPlanError(PlanError):
    """A stored sharding plan (``sparse2d.planner.plan_store``) that cannot be used: its file is
    damaged, or it was passed explicitly and was made for another model, group size, topology
    or TorchRec version. The message names the file and what differs."""


class NoFitError(PlanError):
    """No sharding group size fits device memory; the message lists numbered fixes."""


# --- checkpoints ---------------------------------------------------------------------------


class CheckpointError(Sparse2DError, ValueError):
    """A checkpoint that is missing, incomplete, corrupt or does not match the model (or a bad
    checkpoint argument such as ``keep=0``)."""


class CorruptCheckpointError(CheckpointError):
    """A complete checkpoint whose files are damaged (truncated, missing, bytes changed):
    an older checkpoint may still be good, unlike a mismatch with the model."""


# --- failures at run time ------------------------------------------------------------------


class SyncError(Sparse2DError, RuntimeError):
    """A replica sync refused to average non-finite values; raised on every rank of the job.

    The message names the tables and the global ranks holding NaN/inf; no replica changed.
    """


class FaultToleranceError(Sparse2DError, RuntimeError):
    """Fault-tolerant training cannot go on (no quorum in time, lighthouse lost, every group
    lost); one line naming the cause and the timeout that expired."""

    after_report: Callable[[], None] | None = None
    """Call it after saying the line, before exiting: it waits for the other ranks of the
    group that stop on the same cause to say theirs (torchrun stops a group at its first
    exit). None when no other rank shares the cause."""


class CollectiveCallError(Sparse2DError, RuntimeError):
    """A collective model call (e.g. a FULLY_SHARDED ``state_dict()``) reached by only some
    ranks; raised on the ranks that waited, before any collective, instead of a hang."""


class ClosedError(Sparse2DError, RuntimeError):
    """An object was used after ``close()``; the message names the object and the call."""
