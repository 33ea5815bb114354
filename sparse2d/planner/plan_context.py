"""What a plan for ``L`` ranks depends on, as plain data with a hash.

Everything the planner read: tables, sharders, constraints, topology, batch size, planner
variant and TorchRec version. ``PlanContext.hash`` digests it; ``changes`` names the parts
that differ so a replan says why in one line. TorchRec's ``hash_planner_context_inputs``
leaves the tables out, hence a context of our own.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import torch.nn as nn
import torchrec
from torchrec.distributed.types import ModuleSharder

PLANNER_VERSION = "sparse2d-group-planner/1"
"""Bumped whenever the planning algorithm changes, so older stored plans are replanned."""


@dataclass(frozen=True, slots=True)
class PlanContext:
    """Everything one context's plan depends on (JSON-serializable parts)."""

    parts: dict[str, Any]

    @property
    def hash(self) -> str:
        text = json.dumps(self.parts, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def changes(self, stored: dict[str, Any]) -> str:
        """One phrase naming what differs from the ``stored`` parts (``""``: nothing)."""
        said: list[str] = []
        for key in sorted(set(self.parts) | set(stored)):
            old, new = stored.get(key), self.parts.get(key)
            if old == new:
                continue
            if isinstance(old, dict) and isinstance(new, dict):
                said.append(f"{key}: {_dict_changes(old, new)}")
            else:
                said.append(f"{key} {_short(old)} -> {_short(new)}")
        return "; ".join(said)


def _dict_changes(old: dict[str, Any], new: dict[str, Any]) -> str:
    parts = []
    for key in sorted(set(old) | set(new)):
        if key not in old:
            parts.append(f"{key} added")
        elif key not in new:
            parts.append(f"{key} removed")
        elif old[key] != new[key]:
            parts.append(f"{key} {_short(old[key])} -> {_short(new[key])}")
    shown = parts[:4] + ([f"... {len(parts) - 4} more"] if len(parts) > 4 else [])
    return ", ".join(shown)


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def describe_context(
    module: nn.Module,
    paths: list[str],
    sharders: list[ModuleSharder[nn.Module]],
    constraints: dict[str, Any] | None,
    sharding_group_size: int,
    node_group_size: int,
    device_type: str,
    batch_size: int | None,
) -> PlanContext:
    """The context of planning ``paths`` of ``module`` for ``sharding_group_size`` ranks."""
    return PlanContext(
        parts={
            "tables": _tables(module, paths),
            "sharders": _sharders(sharders, device_type),
            "constraints": {k: repr(v) for k, v in sorted((constraints or {}).items())},
            "sharding_group_size": sharding_group_size,
            "node_group_size": node_group_size,
            "device_type": device_type,
            "batch_size": batch_size,
            "planner": PLANNER_VERSION,
            "torchrec": torchrec.__version__,
        }
    )


def _tables(module: nn.Module, paths: list[str]) -> dict[str, Any]:
    """``{module_path.table: [rows, dim, pooling, features, dtype, optimizer]}``."""
    out: dict[str, Any] = {}
    for path in paths:
        root = module.get_submodule(path)
        params = dict(root.named_parameters())
        for sub_path, sub in root.named_modules():
            configs = _configs(sub)
            for config in configs:
                where = ".".join(p for p in (path, sub_path, config.name) if p)
                suffix = f"{config.name}.weight"
                weight = next((p for n, p in params.items() if n.endswith(suffix)), None)
                out[where] = [
                    config.num_embeddings,
                    config.embedding_dim,
                    str(getattr(config, "pooling", "sequence")),
                    list(config.feature_names),
                    str(config.data_type),
                    _optimizer(weight),
                ]
    return out


def _configs(sub: nn.Module) -> list[Any]:
    for name in ("embedding_bag_configs", "embedding_configs"):
        getter = getattr(sub, name, None)
        if callable(getter):
            try:
                return list(getter())
            except (AttributeError, TypeError):
                return []
    return []


def _optimizer(weight: Any) -> str | None:
    """The in-backward optimizer's class: the planner sizes its state (its learning rate
    does not change the plan, so it is left out)."""
    classes = getattr(weight, "_optimizer_classes", None) if weight is not None else None
    if not classes:
        return None
    return ",".join(f"{c.__module__}.{c.__qualname__}" for c in classes)


def _sharders(sharders: list[ModuleSharder[nn.Module]], device_type: str) -> list[Any]:
    out = []
    for sharder in sharders:
        types = list(sharder.sharding_types(device_type))
        out.append(
            [
                f"{type(sharder).__module__}.{type(sharder).__qualname__}",
                {t: list(sharder.compute_kernels(t, device_type)) for t in types},
                repr(sorted((sharder.fused_params or {}).items(), key=lambda kv: kv[0])),
            ]
        )
    return out
