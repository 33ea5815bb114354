"""Typed errors. Bad input derives from ``ValueError`` (``ConfigError``) so callers can catch
one type; a failure at run time (``SyncError``) is a ``RuntimeError``."""


class ConfigError(ValueError):
    """A bad argument or configuration value; the message names it and the fix."""


class PlanError(ConfigError):
    """A sharding plan that does not fit the sharding group or the model."""


class UnsupportedOptimizerError(ConfigError):
    """A fused embedding optimizer the selected device's kernels cannot run."""


class SyncError(RuntimeError):
    """A replica sync refused to average non-finite values; raised on every rank of the job.

    The message names the tables and the global ranks holding NaN/inf; no replica changed.
    """


class FaultToleranceError(RuntimeError):
    """Fault-tolerant training cannot go on (no quorum in time, lighthouse lost, every group
    lost); one line naming the cause and the timeout that expired."""


class CollectiveCallError(RuntimeError):
    """A collective model call (e.g. a FULLY_SHARDED ``state_dict()``) reached by only some
    ranks; raised on the ranks that waited, before any collective, instead of a hang."""


class StoredPlanError(PlanError):
    """A stored sharding plan (``sparse2d.planner.plan_store``) that cannot be used: its file is
    damaged, or it was passed explicitly and was made for another model, group size, topology
    or TorchRec version. The message names the file and what differs."""
