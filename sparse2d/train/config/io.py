"""Generic strict YAML <-> nested-dataclass machinery behind ``sparse2d.train.config``.

Types come from the dataclass annotations (``int``, ``float``, ``bool``, ``str``,
``Literal``, ``X | None``, ``list[X]``, nested dataclasses); each section validates its
values in ``__post_init__`` by raising ``bad(key, value, why)``, and the loader prefixes
the section path, so every error is one line naming the dotted key. Field docstrings
(the string literal under a field) are read with ``ast`` to generate the reference.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import types
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import yaml

from sparse2d.errors import ConfigError, KeyValueError


def _fmt(value: Any) -> str:
    return "null" if value is None else repr(value) if isinstance(value, str) else str(value)


def bad(key: str, value: Any, why: str) -> KeyValueError:
    """``key=value why`` as a ``ConfigError`` the loader prefixes with the section path."""
    return KeyValueError(key, f"={_fmt(value)} {why}")


def positive(section: Any, *names: str, allow_zero: bool = False) -> None:
    for name in names:
        value = getattr(section, name)
        if value < 0 or (value == 0 and not allow_zero):
            raise bad(name, value, "must be >= 0" if allow_zero else "must be > 0")


def _type_name(tp: Any) -> str:
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join("null" if a is type(None) else _type_name(a) for a in args)
    if origin is list:
        return f"list[{_type_name(args[0])}]"
    if dataclasses.is_dataclass(tp):
        return "section"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str, base: Any = None) -> Any:
    origin, args = get_origin(tp), get_args(tp)
    if dataclasses.is_dataclass(tp):
        return build(tp, value, key, base)
    if origin is Literal:
        if value in args and type(value) in {type(a) for a in args}:
            return value
        raise ConfigError(f"{key}={_fmt(value)} must be one of {', '.join(map(repr, args))}.")
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as error:
                errors.append(error)
        if len(errors) == 1:
            raise errors[0]
        raise ConfigError(f"{key}={_fmt(value)} must be {_type_name(tp)}.")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}={_fmt(value)} must be a list ({_type_name(tp)}).")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is float:
        if isinstance(value, str):  # PyYAML reads 1e-3 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(value, tp):
        return value
    raise ConfigError(f"{key}={_fmt(value)} must be {_type_name(tp)}, not {type(value).__name__}.")


def _section_default(spec: dataclasses.Field) -> Any:  # type: ignore[type-arg]
    """The instance a section field defaults to (keys absent from YAML keep its values), or
    None when it has the class defaults (e.g. ``parallel.sync`` is ``SyncOptions()``)."""
    factory = spec.default_factory
    if factory is dataclasses.MISSING or dataclasses.is_dataclass(factory):
        return None
    value = factory()
    return value if dataclasses.is_dataclass(value) else None


def build(cls: type, data: Any, path: str, base: Any = None) -> Any:
    """``cls`` from the mapping ``data`` found at ``path``; keys ``data`` lacks keep the values
    of ``base`` (when given) or the class defaults. ``KeyValueError`` from the section's own
    checks (``__post_init__``) comes back naming the dotted key."""
    section = path or "<top level>"
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{section} must be a mapping of keys, got {_fmt(data)}.")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields), key=str)
    if unknown:
        raise _unknown_key(cls, unknown[0], path, fields)
    kwargs = {}
    for name, spec in fields.items():
        key = f"{path}.{name}" if path else name
        if name in data:
            kwargs[name] = _coerce(data[name], hints[name], key, _section_default(spec))
        elif base is None and spec.default is spec.default_factory is dataclasses.MISSING:
            raise ConfigError(f"missing required key {key!r} in section {section!r}.")
    try:
        return cls(**kwargs) if base is None else dataclasses.replace(base, **kwargs)
    except KeyValueError as error:
        key = f"{path}.{error.key}" if path and error.key else (error.key or path)
        raise KeyValueError(key, error.detail) from None


def _unknown_key(cls: type, key: Any, path: str, fields: dict[str, Any]) -> ConfigError:
    """One line for a key ``cls`` lacks: why it was retired (a section's ``retired_keys``),
    the key it was renamed to (``renamed_keys``), else every valid key."""
    section = path or "<top level>"
    dotted = f"{path}.{key}" if path else str(key)
    why = getattr(cls, "retired_keys", {}).get(key)
    if why is not None:  # removed after measurement: say why, never ignore it
        return ConfigError(f"{dotted} was retired: {why}.")
    renamed = getattr(cls, "renamed_keys", {}).get(key)
    if renamed is not None:
        now = f"{path}.{renamed}" if path else renamed
        return ConfigError(
            f"{dotted} was renamed {now}: write {now} (same meaning; valid keys in section "
            f"{section!r}: {', '.join(fields)})."
        )
    return ConfigError(
        f"unknown key {key!r} in section {section!r}; valid keys: {', '.join(fields)}."
    )


def apply_override(data: dict[str, Any], override: str) -> None:
    """Apply ``dotted.key=value`` (value parsed as YAML; list entries by index: ``tables.0.rows``)."""
    if "=" not in override:
        raise ConfigError(f"override {override!r} must look like dotted.key=value.")
    key, raw = override.split("=", 1)
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as error:
        raise ConfigError(f"override {key}={raw!r}: value is not valid YAML ({error}).") from None
    parts = key.strip().split(".")
    node: Any = data
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        where = ".".join(parts[: depth + 1])
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(
                    f"override {key}: {where!r} needs an index below {len(node)} (a list)."
                )
            if last:
                node[int(part)] = value
            else:
                node = node[int(part)]
        elif isinstance(node, dict):
            if last:
                node[part] = value
            else:
                node = node.setdefault(part, {})
                if node is None:
                    node = {}
        else:
            raise ConfigError(f"override {key}: {where!r} is not a section.")


def field_docs(cls: type) -> dict[str, str]:
    """The string literal under each field of ``cls`` and of the dataclasses it extends
    (torchtitan style), so a section that embeds a library dataclass shows its docstrings."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        tree = ast.parse(inspect.getsource(klass))
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, after in zip(body, body[1:]):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                    docs[node.target.id] = " ".join(str(after.value.value).split())
    return docs


def _default_text(spec: dataclasses.Field, base: Any) -> str:  # type: ignore[type-arg]
    """The default a key shows: its section's default instance's value when the section has
    one (``base``), else the field's own; nothing for a section."""
    if base is not None:
        value = getattr(base, spec.name)
    elif spec.default is not dataclasses.MISSING:
        value = spec.default
    elif spec.default_factory is not dataclasses.MISSING:
        value = spec.default_factory()
    else:
        return "required"
    return "" if dataclasses.is_dataclass(value) else f"`{json.dumps(value)}`"


HEADER = """\
# Configuration reference

<!-- Generated by sparse2d/train/config/io.py (reference) from the field docstrings of the
schema in sparse2d/train/config/; do not edit by hand. Regenerate with:
python -m sparse2d.train.config --reference > docs/CONFIG.md -->

Generated from the field docstrings of the schema package `sparse2d/train/config/` (one module
per section; `parallel.sync` is `sparse2d.SyncOptions` itself, in `sparse2d/sync/options.py`)
by `python -m sparse2d.train.config --reference > docs/CONFIG.md`; do not edit by hand
(`tests/test_config.py` fails when it is out of date). Override any key on the command line
as `dotted.key=value` (the value is parsed as YAML; list entries by index,
e.g. `model.tables.0.rows=5000`).
"""


def reference(root: type) -> str:
    """Markdown reference of every section and key, under ``HEADER``."""
    out = HEADER.splitlines() + [""]
    queue: list[tuple[str, type, Any]] = [("", root, None)]
    while queue:
        path, cls, base = queue.pop(0)
        title = path or "top level"
        out += [f"## `{title}`", "", " ".join((cls.__doc__ or "").split()), ""]
        out += ["| key | type | default | description |", "| --- | --- | --- | --- |"]
        hints, docs = get_type_hints(cls), field_docs(cls)
        nested: list[tuple[str, type, Any]] = []
        for spec in dataclasses.fields(cls):
            tp = hints[spec.name]
            sub = get_args(tp)[0] if get_origin(tp) is list else tp
            key = f"{path}.{spec.name}" if path else spec.name
            if dataclasses.is_dataclass(sub):
                nested.append((f"{key}[]" if sub is not tp else key, sub, _section_default(spec)))
            type_text = _type_name(tp).replace("|", "\\|")
            doc = docs.get(spec.name, "").replace("|", "\\|")
            out.append(f"| `{spec.name}` | {type_text} | {_default_text(spec, base)} | {doc} |")
        out.append("")
        queue = nested + queue
    return "\n".join(out).rstrip() + "\n"
