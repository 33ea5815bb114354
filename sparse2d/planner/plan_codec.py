"""A TorchRec ``ShardingPlan`` as plain JSON data, and back (exactly).

The plan store (``sparse2d.planner.plan_store``) keeps plans as readable JSON rather
than pickles: a user can read which ranks hold which table, and a damaged file fails to
decode with a message instead of running arbitrary code. Only the fields a planner fills
in are written; the rare object-valued ones (``cache_params``, ``key_value_params``) go
through ``repr``-free pickling, base64 encoded, so a plan with them still round-trips.
"""

from __future__ import annotations

import base64
import pickle
from typing import Any

from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharding_spec import EnumerableShardingSpec
from torchrec.distributed import types as trec_types
from torchrec.distributed.types import (
    BoundsCheckMode,
    EmbeddingModuleShardingPlan,
    ParameterSharding,
    ShardingPlan,
)
from torchrec.types import DataType

from sparse2d.errors import StoredPlanError

_PICKLED = ("cache_params", "key_value_params")
_PLAIN = ("enforce_hbm", "stochastic_rounding")


def encode_plan(plan: ShardingPlan) -> dict[str, Any]:
    """``{module_path: {"type": class name, "tables": {table: sharding}}}``."""
    out: dict[str, Any] = {}
    for path, module_plan in plan.plan.items():
        out[path] = {
            "type": type(module_plan).__name__,
            "tables": {name: _encode_sharding(s) for name, s in module_plan.items()},  # type: ignore[union-attr]
        }
    return out


def decode_plan(data: dict[str, Any]) -> ShardingPlan:
    """The inverse of ``encode_plan``; raises ``ValueError``/``KeyError``/``TypeError`` on
    anything malformed (the store turns that into one error naming the file)."""
    plan: dict[str, Any] = {}
    for path, entry in data.items():
        cls = getattr(trec_types, entry["type"], None)
        if not (isinstance(cls, type) and issubclass(cls, EmbeddingModuleShardingPlan)):
            raise StoredPlanError(
                f"module {path!r}: unknown plan type {entry['type']!r}; the plan was stored by "
                "another TorchRec version: delete the file to plan again"
            )
        module_plan = cls()
        for name, sharding in entry["tables"].items():
            module_plan[name] = _decode_sharding(sharding)
        plan[path] = module_plan
    return ShardingPlan(plan=plan)


def _encode_sharding(s: ParameterSharding) -> dict[str, Any]:
    out: dict[str, Any] = {
        "sharding_type": s.sharding_type,
        "compute_kernel": s.compute_kernel,
        "ranks": None if s.ranks is None else [int(r) for r in s.ranks],
        "shards": _encode_spec(s.sharding_spec),
    }
    for key in _PLAIN:
        if getattr(s, key) is not None:
            out[key] = bool(getattr(s, key))
    if s.bounds_check_mode is not None:
        out["bounds_check_mode"] = s.bounds_check_mode.name
    if s.output_dtype is not None:
        out["output_dtype"] = s.output_dtype.name
    for key in _PICKLED:
        if getattr(s, key) is not None:
            out[key] = base64.b64encode(pickle.dumps(getattr(s, key))).decode("ascii")
    return out


def _encode_spec(spec: Any) -> list[list[Any]] | None:
    if spec is None:
        return None
    if not isinstance(spec, EnumerableShardingSpec):
        raise TypeError(f"cannot store a sharding spec of type {type(spec).__name__}")
    return [[list(m.shard_offsets), list(m.shard_sizes), str(m.placement)] for m in spec.shards]


def _decode_sharding(d: dict[str, Any]) -> ParameterSharding:
    shards = d["shards"]
    spec = None
    if shards is not None:
        spec = EnumerableShardingSpec(
            [
                ShardMetadata(
                    shard_offsets=[int(x) for x in offsets],
                    shard_sizes=[int(x) for x in sizes],
                    placement=str(placement),
                )
                for offsets, sizes, placement in shards
            ]
        )
    ranks = d["ranks"]
    kwargs: dict[str, Any] = {key: d[key] for key in _PLAIN if key in d}
    if "bounds_check_mode" in d:
        kwargs["bounds_check_mode"] = BoundsCheckMode[d["bounds_check_mode"]]
    if "output_dtype" in d:
        kwargs["output_dtype"] = DataType[d["output_dtype"]]
    for key in _PICKLED:
        if key in d:
            kwargs[key] = pickle.loads(base64.b64decode(d[key]))  # noqa: S301 (own run dir)
    return ParameterSharding(
        sharding_type=str(d["sharding_type"]),
        compute_kernel=str(d["compute_kernel"]),
        ranks=None if ranks is None else [int(r) for r in ranks],
        sharding_spec=spec,
        **kwargs,
    )
