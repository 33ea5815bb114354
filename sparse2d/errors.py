"""Typed errors. All derive from ``ValueError`` so callers can catch one type."""


class ConfigError(ValueError):
    """A bad argument or configuration value; the message names it and the fix."""


class PlanError(ConfigError):
    """A sharding plan that does not fit the sharding group or the model."""


class UnsupportedOptimizerError(ConfigError):
    """A fused embedding optimizer the selected device's kernels cannot run."""
