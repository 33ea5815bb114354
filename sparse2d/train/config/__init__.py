"""Trainer configuration: nested dataclasses loaded from YAML, with dotted CLI overrides.

Every field carries a docstring (the string literal under it); ``python -m sparse2d.train.config
--reference`` turns them into ``docs/CONFIG.md``. Loading is strict: unknown keys are
rejected with the list of valid ones, types are checked, and every error is one line
naming the dotted key, e.g. ``optimizer.sparse.lr=-0.1 must be > 0``. Checks that need
the world size run in ``check_runtime`` at trainer start, identically on every rank and
before any collective.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import yaml

from sparse2d.errors import ConfigError
from sparse2d.train.config.io import apply_override, build, field_docs
from sparse2d.train.config.io import reference as _reference
from sparse2d.train.config.schema import Config

__all__ = [
    "Config",
    "apply_override",
    "dump_yaml",
    "field_docs",
    "load_config",
    "main",
    "reference",
]


def load_config(path: str | None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read YAML (or start empty), apply overrides, build and validate a ``Config``."""
    data: dict[str, Any] = {}
    if path is not None:
        if not os.path.exists(path):
            raise ConfigError(f"--config {path!r}: file not found.")
        with open(path) as f:
            try:
                data = yaml.safe_load(f) or {}
            except yaml.YAMLError as error:
                raise ConfigError(f"{path}: not valid YAML: {error}".replace("\n", " ")) from None
    for override in overrides:
        apply_override(data, override)
    return build(Config, data, "")


def dump_yaml(cfg: Config) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)


def reference() -> str:
    """Markdown reference of every section and key (``docs/CONFIG.md``)."""
    return _reference(Config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparse2d.train.config", description=__doc__)
    parser.add_argument("--reference", action="store_true", help="print docs/CONFIG.md")
    parser.add_argument("--check", metavar="CONFIG", help="load and validate CONFIG")
    parser.add_argument("--print", dest="show", action="store_true", help="print resolved YAML")
    parser.add_argument("--world-size", type=int, help="also run the world-size checks")
    parser.add_argument("--local-world-size", type=int)
    parser.add_argument("--no-paths", action="store_true", help="skip data file checks")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value overrides")
    args = parser.parse_args(argv)
    if args.reference:
        sys.stdout.write(reference())
        return 0
    if not args.check:
        parser.error("give --reference or --check CONFIG")
    try:
        cfg = load_config(args.check, args.overrides)
        if args.world_size:
            cfg.check_runtime(args.world_size, args.local_world_size, not args.no_paths)
    except ConfigError as error:
        print(f"sparse2d: config error: {error}", file=sys.stderr)
        return 1
    if args.show:
        sys.stdout.write(dump_yaml(cfg))
    return 0
