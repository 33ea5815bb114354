"""Every rule that refuses a combination of options, stated once, as data.

A rule names the options it relates (as ``docs/compatibility.md`` names them; a page test
checks the page against ``RULES``), the settings it reads, when it refuses, the fundamental
reason and the fix. Every caller states what it knows as a flat mapping of settings (keys
below) and asks ``first_conflict``; a rule runs only when every key it reads is known, so
``SyncOptions`` checks its own fields, ``DMPCollection`` the sync options with the sharding
strategy and managed-collision tables, fault tolerance the sync options it cannot run, and
the trainer's config loader all of them at once, before any process starts. Each names the
keys its own way (``names``) and raises its own error type.

Pure: no torch, so the launch scripts' config check stays a short process.

Settings keys: ``sync.<field>`` (every ``SyncOptions`` field), ``sharding_strategy``
(``default``/``fully_sharded``, any case), ``sharding_group_size`` (int, ``"auto"`` or
None), ``node_group_size``, ``world_size``, ``replica_layout``, ``fault_tolerance`` (bool),
``managed_collision`` (falsy: none; the kind ``mch``/``zch``, or the tables' names),
``mch.eviction_interval``, ``pipeline`` (trainer value or TorchRec class name),
``custom_all_reduce`` (bool), ``checkpoint.every``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sparse2d.errors import ConfigError

Settings = Mapping[str, Any]

EARLY_LOOKUP_PIPELINES = ("semi_sync", "TrainPipelineSemiSync", "TrainPipelineFusedSparseDist")
"""Pipelines that look up batch ``i+1`` before batch ``i``'s sync: the trainer's
``train.pipeline`` value and TorchRec's class names (``sparse2d.core.pipeline_guard``)."""


@dataclass(frozen=True, slots=True)
class Rule:
    """One refused combination."""

    options: tuple[str, ...]
    """The options it relates, named as ``docs/compatibility.md`` names them."""
    keys: tuple[str, ...]
    """The settings it reads; the message names the first one first."""
    refuses: Callable[[Settings], bool]
    """Whether these settings are the refused combination."""
    reason: str
    """Why, fundamentally (the page's "refused" row says the same)."""
    fix: str
    """What to do instead; ``{key}`` is replaced by the caller's name for ``key``."""
    head: str = ""
    """The message's start; ``{key=}`` is ``name=value``. Default: the first key
    ``cannot run with`` the others."""

    def applies(self, settings: Settings) -> bool:
        """Whether every key it reads is known and the combination is the refused one."""
        return all(k in settings for k in self.keys) and self.refuses(settings)

    def message(self, settings: Settings, names: Mapping[str, str]) -> str:
        """One line: the keys and values as the caller names them, the reason, the fix."""
        others = " and ".join(f"{{{k}=}}" for k in self.keys[1:])
        head = self.head or f"{{{self.keys[0]}=}} cannot run with {others}"
        fix = self.fix
        for key in self.keys:
            name = key_name(key, names)
            head = head.replace(f"{{{key}=}}", f"{name}={settings[key]!r}")
            head, fix = head.replace(f"{{{key}}}", name), fix.replace(f"{{{key}}}", name)
        return f"{head}: {self.reason}; {fix}."


@dataclass(frozen=True, slots=True)
class Conflict:
    """A rule these settings break, as the caller names it: ``key`` then ``detail``."""

    rule: Rule
    key: str
    detail: str

    def __str__(self) -> str:
        return self.key + self.detail


def key_name(key: str, names: Mapping[str, str]) -> str:
    """The caller's name for ``key``: ``names[key]``, else a prefix entry (``"sync."`` ->
    ``"parallel.sync."``) rewritten, else ``key`` itself."""
    if key in names:
        return names[key]
    for prefix, replacement in names.items():
        if prefix.endswith(".") and key.startswith(prefix):
            return replacement + key[len(prefix) :]
    return key


def conflicts(settings: Settings) -> list[Rule]:
    """Every rule these settings break, in ``RULES`` order."""
    return [rule for rule in RULES if rule.applies(settings)]


def first_conflict(settings: Settings, names: Mapping[str, str]) -> Conflict | None:
    """The first rule these settings break, as the caller names it; None when none."""
    broken = conflicts(settings)
    if not broken:
        return None
    name, text = key_name(broken[0].keys[0], names), broken[0].message(settings, names)
    return Conflict(broken[0], name, text.removeprefix(name))  # every head starts with it


def check(settings: Settings, names: Mapping[str, str]) -> None:
    """Raise ``ConfigError`` for the first rule these settings break (pure: every rank
    raises the same before any collective)."""
    conflict = first_conflict(settings, names)
    if conflict is not None:
        raise ConfigError(str(conflict))


def sync_settings(sync_options: Any) -> dict[str, Any]:
    """``SyncOptions`` as settings (``sync.<field>``)."""
    return {
        f"sync.{f.name}": getattr(sync_options, f.name) for f in dataclasses.fields(sync_options)
    }


LIBRARY_NAMES = {"sync.": "sync_options.", "managed_collision": "managed-collision tables"}
"""How ``DMPCollection`` and fault tolerance name the settings in their messages."""


def check_collection(
    sync_options: Any, strategy: str, managed_collision: list[str], custom_all_reduce: bool
) -> None:
    """``DMPCollection``'s check of one context: its sync options with its sharding strategy
    (a ``ShardingStrategy`` name), the model's managed-collision tables and the hook."""
    settings = sync_settings(sync_options) | {
        "sharding_strategy": strategy,
        "managed_collision": managed_collision,
        "custom_all_reduce": custom_all_reduce,
    }
    check(settings, LIBRARY_NAMES)


def check_fault_tolerance(sync_options: Any, fully_sharded: bool, custom_all_reduce: bool) -> None:
    """Fault tolerance's check, on every rank before anything connects: the model's sync
    options, whether it is FULLY_SHARDED, and whether it has an all-reduce hook."""
    settings = sync_settings(sync_options) | {
        "fault_tolerance": True,
        "sharding_strategy": "FULLY_SHARDED" if fully_sharded else "DEFAULT",
        "custom_all_reduce": custom_all_reduce,
    }
    check(settings, LIBRARY_NAMES)


# ---- the rules -------------------------------------------------------------------------


def _fully_sharded(s: Settings) -> bool:
    return str(s["sharding_strategy"]).lower() == "fully_sharded"


def _node_group_splits_no_group(s: Settings) -> bool:
    """A set ``node_group_size`` (0 and None: unset, as in TorchRec) that does not divide the
    sharding group (``"auto"``: not chosen yet)."""
    nodes, group = s["node_group_size"], s["sharding_group_size"] or s["world_size"]
    return nodes not in (None, 0) and group != "auto" and (nodes < 1 or group % nodes != 0)


def _against(
    feature: str, feature_key: str, active: Callable[[Settings], bool], way_out: str
) -> Callable[[str, str, Callable[[Any], bool], str, str], Rule]:
    """Rules of one feature against the options it cannot run: each refuses ``key`` where
    ``refuses(value)`` while the feature is ``active``, its fix ending in ``way_out``."""

    def rule(option: str, key: str, refuses: Callable[[Any], bool], reason: str, fix: str) -> Rule:
        return Rule(
            (feature, option),
            (feature_key, key),
            lambda s: active(s) and refuses(s[key]),
            reason,
            fix + way_out,
        )

    return rule


_fs = _against(
    "fully_sharded", "sharding_strategy", _fully_sharded, ", or use the default sharding strategy"
)
"""FULLY_SHARDED with a sync option it replaces."""
_ft = _against(
    "fault_tolerance",
    "fault_tolerance",
    lambda s: bool(s["fault_tolerance"]),
    ", or disable fault tolerance",
)
"""Fault tolerance with an option it cannot run."""
_mc = _against(
    "managed_collision",
    "managed_collision",
    lambda s: bool(s["managed_collision"]),
    ", or drop the managed-collision tables",
)
"""Managed-collision tables with an option that assumes a row keeps its id."""


_NO_SEPARATE_SYNC = (
    "FULLY_SHARDED averages weights and every optimizer state by a reduce-scatter inside "
    "every step: there is no separate sync whose "
)
_NEEDS_STATE = "it acts on the optimizer state's average, and no optimizer state is averaged"

RULES: tuple[Rule, ...] = (
    # ---- within SyncOptions ----
    Rule(
        ("delayed_state", "no_optimizer_state"),
        ("sync.delayed_optimizer_state", "sync.include_optimizer_state"),
        lambda s: s["sync.delayed_optimizer_state"] and not s["sync.include_optimizer_state"],
        _NEEDS_STATE,
        "enable {sync.include_optimizer_state} or drop {sync.delayed_optimizer_state}",
    ),
    Rule(
        ("momentum_scaling", "no_optimizer_state"),
        ("sync.momentum_scaling", "sync.include_optimizer_state"),
        lambda s: s["sync.momentum_scaling"] and not s["sync.include_optimizer_state"],
        _NEEDS_STATE,
        "enable {sync.include_optimizer_state} or drop {sync.momentum_scaling}",
    ),
    Rule(
        ("stream", "delayed_state"),
        ("sync.stream", "sync.delayed_optimizer_state"),
        lambda s: s["sync.stream"] and s["sync.delayed_optimizer_state"],
        "a streamed fragment carries its rows' optimizer state with their weights, behind the "
        "next step and delta-corrected: delaying the state again leaves no transfer to hide",
        "drop {sync.delayed_optimizer_state}",
    ),
    # ---- FULLY_SHARDED replaces the sync ----
    _fs(
        "sync_every_4",
        "sync.every",
        lambda v: v != 1,
        _NO_SEPARATE_SYNC + "cadence could change",
        "set {sync.every}=1",
    ),
    _fs(
        "sparse_engine",
        "sync.engine",
        lambda v: v == "sparse",
        _NO_SEPARATE_SYNC + "row set (every row is reduce-scattered) could change",
        "use {sync.engine}='dense' or 'auto'",
    ),
    _fs(
        "delayed_state",
        "sync.delayed_optimizer_state",
        bool,
        _NO_SEPARATE_SYNC + "optimizer-state transfer could lag a step",
        "drop {sync.delayed_optimizer_state}",
    ),
    _fs(
        "stream",
        "sync.stream",
        bool,
        _NO_SEPARATE_SYNC + "rows could be streamed",
        "drop {sync.stream}",
    ),
    _fs(
        "momentum_scaling",
        "sync.momentum_scaling",
        bool,
        "FULLY_SHARDED averages the accumulators every step, exactly as 1D sums them: there is "
        "no replica drift for a scale factor to correct",
        "drop {sync.momentum_scaling}",
    ),
    _fs(
        "no_optimizer_state",
        "sync.include_optimizer_state",
        lambda v: not v,
        "the reduce-scatter overwrites the only copy of the optimizer state each replica keeps "
        "(1/G at rest), so state left unaveraged would leave the replicas disagreeing for good",
        "enable {sync.include_optimizer_state}",
    ),
    _fs(
        "no_check_finite",
        "sync.check_finite",
        lambda v: not v,
        "its NaN/inf vote before the reduce-scatter is what keeps one replica's NaN/inf from "
        "overwriting every replica's slice (each replica keeps no other copy)",
        "enable {sync.check_finite}",
    ),
    # ---- managed-collision tables: ids move between rows at a sync ----
    _mc(
        "momentum_scaling",
        "sync.momentum_scaling",
        bool,
        "momentum scaling rescales each row's accumulator growth after a sync, but a "
        "managed-collision sync moves ids between rows, so a scaled accumulator would land "
        "on another id",
        "drop {sync.momentum_scaling}",
    ),
    _mc(
        "fully_sharded",
        "sharding_strategy",
        lambda v: str(v).lower() == "fully_sharded",
        "each replica would hold 1/G of rows whose ids differ per replica between syncs",
        "use the default sharding strategy",
    ),
    _mc(
        "pipeline_semi_sync",
        "pipeline",
        lambda v: v in EARLY_LOOKUP_PIPELINES,
        "it looks up the next batch's embeddings before this batch's sync, and a sync of "
        "managed-collision tables moves ids between rows, so that lookup would read and update "
        "the wrong rows",
        "use a pipeline that looks up after the sync (TorchRec's TrainPipelineSparseDist)",
    ),
    _mc(
        "custom_all_reduce",
        "custom_all_reduce",
        bool,
        "their rows are merged by id (a sum over the replicas holding each id), which an "
        "averaging hook cannot express",
        "drop {custom_all_reduce}",
    ),
    Rule(
        ("checkpoint_every", "mch_eviction_interval"),
        ("checkpoint.every", "managed_collision", "mch.eviction_interval"),
        lambda s: (
            s["managed_collision"] == "mch"
            and s["checkpoint.every"] % s["mch.eviction_interval"] != 0
        ),
        "ids seen since the last eviction round are not in checkpoints, as in TorchRec's own "
        "state dict",
        "save on eviction rounds",
        head="{checkpoint.every=} must be a multiple of {mch.eviction_interval=}",
    ),
    Rule(
        ("checkpoint_every", "sync_every"),
        ("checkpoint.every", "sync.every"),
        lambda s: s["checkpoint.every"] % s["sync.every"] != 0,
        "a checkpoint is saved right after a sync, when the replicas agree",
        "save on sync steps",
        head="{checkpoint.every=} must be a multiple of {sync.every=}",
    ),
    Rule(
        ("node_group_size", "sharding_group_size"),
        ("node_group_size", "sharding_group_size", "world_size"),
        _node_group_splits_no_group,
        "TorchRec's table-row-wise and grid shardings split a sharding group (null: the whole "
        "world) into hosts of node_group_size ranks",
        "pass a divisor of the sharding group size, or leave {node_group_size} unset",
        head="{node_group_size=} must divide {sharding_group_size=} (of {world_size=})",
    ),
    # ---- fault tolerance: one torchrun world is one group; a step's vote covers finished work ----
    _ft(
        "fully_sharded",
        "sharding_strategy",
        lambda v: str(v).lower() == "fully_sharded",
        "a group holds 1/G of every buffer between steps, so when a group is lost no live "
        "group holds its part: nothing to heal from",
        "use the default sharding strategy",
    ),
    _ft(
        "auto_group_size",
        "sharding_group_size",
        lambda v: v == "auto",
        "each torchrun world is one sharding group, so L is the launch's process count: there "
        "is no L left for auto to choose",
        "leave {sharding_group_size} unset",
    ),
    Rule(
        ("fault_tolerance", "sharding_group_size"),
        ("sharding_group_size", "fault_tolerance", "world_size"),
        lambda s: (
            bool(s["fault_tolerance"])
            and s["sharding_group_size"] not in (None, "auto", s["world_size"])
        ),
        "each torchrun world (all of its ranks) is one sharding group; the groups of a "
        "fault-tolerant job are separate launches",
        "leave {sharding_group_size} unset and set the number of groups in the fault-tolerance "
        "options",
        head="{sharding_group_size=} with {fault_tolerance=} and {world_size=}",
    ),
    _ft(
        "delayed_state",
        "sync.delayed_optimizer_state",
        bool,
        "the states' average would finish one step late, across the boundary where torchft "
        "forms the next quorum: a step's commit vote can only cover collectives that "
        "finished before it, and an average spanning two quorums has members that joined or "
        "left in between",
        "drop {sync.delayed_optimizer_state}",
    ),
    _ft(
        "stream",
        "sync.stream",
        bool,
        "a streamed fragment's average runs behind the next step, across the boundary where "
        "torchft forms the next quorum, and a group healed mid-stream would copy rows a live "
        "group holds at other phases: a step's commit can only cover collectives that "
        "finished before it",
        "drop {sync.stream}",
    ),
    _ft(
        "no_optimizer_state",
        "sync.include_optimizer_state",
        lambda v: not v,
        "a heal and the average carry the optimizer state; groups must agree on it",
        "enable {sync.include_optimizer_state}",
    ),
    _ft(
        "no_check_finite",
        "sync.check_finite",
        lambda v: not v,
        "each rank scans what it sends for NaN/inf and its flag fails the step's commit in "
        "every group; that scan is what keeps a bad value out of every group",
        "enable {sync.check_finite}",
    ),
    _ft(
        "divergence_metric",
        "sync.divergence_every",
        bool,
        "the fault-tolerant sync is the blocking average over the quorum and measures no "
        "divergence between groups",
        "set {sync.divergence_every}=0",
    ),
    _ft(
        "inter_host",
        "replica_layout",
        lambda v: v != "intra_host",
        "a torchrun world is one sharding group and torchft joins rank r of every group: where "
        "replicas sit is where each group's torchrun runs, not a key of the config",
        "leave {replica_layout} at intra_host",
    ),
    _ft(
        "custom_all_reduce",
        "custom_all_reduce",
        bool,
        "the hook takes a torch process group, and the fault-tolerant average runs over "
        "torchft's managed group",
        "drop {custom_all_reduce}",
    ),
)
"""Every refused combination of options (``docs/compatibility.md`` lists each one)."""
