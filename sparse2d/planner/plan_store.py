"""Plans made once per job and reused: a restart, a relaunch, a dry run and every
fault-tolerant replica group load the stored plan for ``L`` instead of planning again.

A directory store keeps ``plan_<context>_L<L>.json`` per context (the plan, its
``PlanContext`` and a checksum); a file given on purpose must match (``StoredPlanError``).
TorchRec's ``PlanLoader`` still enumerates every option for a loaded plan (seconds at
``L=256``) and its context hash leaves the tables out; this store skips the planner and
checks the tables itself. Behaviour: docs/training.md, "Start-up at scale".
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from typing import Any

from torchrec.distributed.types import ShardingPlan

from sparse2d.errors import ConfigError, StoredPlanError
from sparse2d.planner.plan_codec import decode_plan, encode_plan
from sparse2d.planner.plan_context import PlanContext

FORMAT = "sparse2d-plan/1"


@dataclass(slots=True)
class Lookup:
    """What the store answered for one context."""

    plan: ShardingPlan | None
    """The stored plan when usable, else ``None`` (plan afresh)."""
    cache: str
    """``hit`` (loaded), ``miss`` (none stored), ``stale`` (stored for another context)."""
    file: str
    reason: str = ""
    """For ``stale``: what changed, e.g. ``tables: t3 [100, ...] -> [200, ...]``."""


class PlanStore:
    """Stored plans in ``location``: a directory (reuse when matching, else replan) or,
    with ``location`` naming a ``.json`` file, one plan that must match."""

    def __init__(self, location: str | os.PathLike[str]) -> None:
        self.location = os.fspath(location)
        self.explicit = self.location.endswith(".json")

    def __repr__(self) -> str:
        return f"PlanStore({self.location!r})"

    def file_for(self, name: str, sharding_group_size: int) -> str:
        if self.explicit:
            return self.location
        return os.path.join(self.location, f"plan_{name}_L{sharding_group_size}.json")

    def lookup(self, name: str, context: PlanContext) -> Lookup:
        """The stored plan for ``name`` if it was made for ``context``."""
        path = self.file_for(name, context.parts["sharding_group_size"])
        if not os.path.exists(path):
            if self.explicit:
                raise StoredPlanError(
                    f"stored plan {path!r} does not exist; pass an existing plan file, or a "
                    "directory to plan once and store the plan there."
                )
            return Lookup(None, "miss", path)
        stored, plan = read_plan_file(path)
        if stored["context_hash"] == context.hash:
            return Lookup(plan, "hit", path)
        reason = context.changes(stored["context"]) or "context hash differs"
        if self.explicit:
            raise StoredPlanError(
                f"stored plan {path!r} was made for another setup ({reason}); pass the "
                "plan file made for this model and sharding group, or a plan directory "
                "to replan."
            )
        return Lookup(None, "stale", path, reason)

    def save(self, name: str, context: PlanContext, plan: ShardingPlan) -> str:
        """Write the plan atomically (temp file + rename); returns the file."""
        path = self.file_for(name, context.parts["sharding_group_size"])
        encoded = encode_plan(plan)
        record = {
            "format": FORMAT,
            "context_hash": context.hash,
            "context": context.parts,
            "plan": encoded,
            "checksum": _checksum(encoded),
        }
        directory = os.path.dirname(path) or "."
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".plan-", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(record, f, separators=(",", ":"))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return path


def as_plan_store(value: str | os.PathLike[str] | PlanStore | None) -> PlanStore | None:
    """``DMPCollection(plan_store=...)``: a directory, a ``.json`` plan file or a store."""
    if value is None or isinstance(value, PlanStore):
        return value
    if isinstance(value, str | os.PathLike):
        return PlanStore(value)
    raise ConfigError(
        f"plan_store={value!r} must be a directory, a stored plan's .json file, or a "
        "sparse2d.planner.PlanStore."
    )


def read_plan_file(path: str) -> tuple[dict[str, Any], ShardingPlan]:
    """The checksum-verified record of a plan file and its plan; ``StoredPlanError``
    naming the file when it is not one (truncated, edited, another format)."""

    def refuse(why: str) -> StoredPlanError:
        return StoredPlanError(
            f"stored plan {path!r} is damaged ({why}); delete it to plan afresh (the next "
            "start stores a new one)."
        )

    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise refuse(str(error)) from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise refuse(f"not a {FORMAT} file")
    for key in ("context_hash", "context", "plan", "checksum"):
        if key not in record:
            raise refuse(f"no {key!r}")
    if _checksum(record["plan"]) != record["checksum"]:
        raise refuse("checksum mismatch")
    try:
        return record, decode_plan(record["plan"])
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise refuse(f"undecodable plan: {error!r}") from None


def _checksum(encoded: dict[str, Any]) -> str:
    text = json.dumps(encoded, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
