"""``docs/compatibility.md`` is the truth about which trainer options compose.

Three checks keep it honest:

- every refusal on the page is a rule of ``sparse2d.option_conflicts`` with the same reason,
  and every rule is on the page;
- every pair of the page's options is listed exactly once, and the config loader accepts a
  pair exactly when the page says it works (a refusal the page does not state, or an
  acceptance of a pair it says is refused, fails here); every "works" row names a test that
  exists, and every "refused" row states its reason;
- the pairs the page says work are not only accepted but train: a handful of short trainer
  runs in the shared 4-rank world, each combining many options, covers every working pair
  that runs inside one world (``COVERING_RUNS``; pairwise testing), and each run must end
  with finite losses and bit-identical replicas (weights, optimizer state and
  managed-collision identity tables) — a combination that silently diverges fails here.
"""

from __future__ import annotations

import ast
import itertools
import math
import re
from pathlib import Path
from typing import Any

import pytest

from sparse2d.errors import ConfigError
from sparse2d.train.config import load_config

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "compatibility.md"
BASE = "configs/tiny_cpu.yaml"
BASE_OVERRIDES = ["parallel.sync.divergence_every=0"]
"""The main job without its divergence metric: options are judged against a plain base."""

OPTIONS: dict[str, list[str]] = {
    "fault_tolerance": [
        "fault_tolerance.enable=true",
        "fault_tolerance.num_groups=2",
        "parallel.sharding_group_size=null",
    ],
    "pipeline_sparse_dist": ["train.pipeline=sparse_dist"],
    "pipeline_semi_sync": ["train.pipeline=semi_sync"],
    "mch": ["model.managed_collision.enabled=true", "model.managed_collision.kind=mch"],
    "mp_zch": ["model.managed_collision.enabled=true", "model.managed_collision.kind=zch"],
    "fully_sharded": ["parallel.sharding_strategy=fully_sharded"],
    "checkpoints": ["checkpoint.every=4"],
    "auto_group_size": ["parallel.sharding_group_size=auto"],
    "sync_every_4": ["parallel.sync.every=4"],
    "stream": ["parallel.sync.stream=true"],
    "sparse_engine": ["parallel.sync.engine=sparse"],
    "delayed_state": ["parallel.sync.delayed_optimizer_state=true"],
    "momentum_scaling": ["parallel.sync.momentum_scaling=true"],
    "inter_host": ["parallel.replica_layout=inter_host"],
}
"""The options users combine, each as the trainer overrides that switch it on."""

ALTERNATIVES = [{"pipeline_sparse_dist", "pipeline_semi_sync"}, {"mch", "mp_zch"}]
"""Two values of one key: never a pair."""

WORLD = 4
FT_GROUP_WORLD = 2
"""World sizes the config checks run at: the 2x2 mesh, and one fault-tolerant group of 2."""


def pairs() -> list[tuple[str, str]]:
    return [
        (a, b)
        for a, b in itertools.combinations(OPTIONS, 2)
        if {a, b} not in [set(x) for x in ALTERNATIVES]
    ]


def overrides(*names: str) -> list[str]:
    return BASE_OVERRIDES + [o for name in names for o in OPTIONS[name]]


def refusal(*names: str) -> str | None:
    """The config loader's error for these options together, or None when accepted."""
    try:
        cfg = load_config(str(ROOT / BASE), overrides(*names))
        world = FT_GROUP_WORLD if cfg.fault_tolerance.enable else WORLD
        cfg.check_runtime(world, world, check_paths=False)
    except ConfigError as error:
        return str(error)
    return None


ROW = re.compile(r"^\|\s*`(\w+)`\s*\|\s*`(\w+)`\s*\|\s*(works|refused)\s*\|\s*(.+?)\s*\|\s*$")


def page_rows() -> dict[frozenset[str], tuple[str, str]]:
    """``{pair: (status, evidence)}`` from the page's pair table; duplicates fail."""
    rows: dict[frozenset[str], tuple[str, str]] = {}
    for line in PAGE.read_text().splitlines():
        match = ROW.match(line)
        if match is None:
            continue
        a, b, status, evidence = match.groups()
        key = frozenset((a, b))
        assert key not in rows, f"docs/compatibility.md lists `{a}` x `{b}` twice"
        rows[key] = (status, evidence)
    return rows


def test_page_lists_every_pair_once_with_known_options() -> None:
    rows = page_rows()
    unknown = sorted({o for key in rows for o in key} - set(OPTIONS))
    assert not unknown, f"docs/compatibility.md names options this test does not know: {unknown}"
    missing = [f"{a} x {b}" for a, b in pairs() if frozenset((a, b)) not in rows]
    assert not missing, f"docs/compatibility.md does not list: {missing}"
    assert len(rows) == len(pairs())


@pytest.mark.parametrize("pair", pairs(), ids=lambda p: f"{p[0]}-{p[1]}")
def test_config_loader_agrees_with_the_page(pair: tuple[str, str]) -> None:
    status, evidence = page_rows()[frozenset(pair)]
    error = refusal(*pair)
    if status == "works":
        assert error is None, f"the page says {pair} works, the config refuses it: {error}"
    else:
        assert error is not None, f"the page says {pair} is refused ({evidence}); it is accepted"
        assert len(evidence) > 20, f"{pair}: a refusal states its fundamental reason"


GROUPS = {"managed_collision": ("mch", "mp_zch")}
"""A rule's option that stands for several of the page's (every kind of MC table)."""

OUTSIDE = re.compile(r"^- `(\w+)` \+ `(\w+)`: (.+)$")


def rule_rows() -> tuple[dict[frozenset[str], str], dict[tuple[str, str], str]]:
    """What the page must say, from ``sparse2d.option_conflicts.RULES``: the reason of every
    refused pair of the table, and of every rule relating an option outside it."""
    from sparse2d.option_conflicts import RULES

    table: dict[frozenset[str], str] = {}
    outside: dict[tuple[str, str], str] = {}
    for rule in RULES:
        a, b = rule.options
        left, right = GROUPS.get(a, (a,)), GROUPS.get(b, (b,))
        if set(left + right) <= set(OPTIONS):
            table |= {frozenset((x, y)): rule.reason for x in left for y in right}
        else:
            outside[(a, b)] = rule.reason
    return table, outside


def test_every_refusal_on_the_page_is_a_rule_of_the_library_and_every_rule_is_on_it() -> None:
    """``sparse2d.option_conflicts`` is the one list of refused combinations: the page's
    refused rows and its "Refused outside the table" lines are exactly its rules, reason for
    reason (a rule added, dropped or reworded without the page fails here)."""
    table, outside = rule_rows()
    refused = {k: why for k, (status, why) in page_rows().items() if status == "refused"}
    for key in sorted(set(table) | set(refused), key=sorted):
        expected = f"| `{sorted(key)[0]}` | `{sorted(key)[1]}` | refused | {table.get(key)} |"
        assert refused.get(key) == table.get(key), f"docs/compatibility.md must read: {expected}"
    lines = [OUTSIDE.match(line) for line in PAGE.read_text().splitlines()]
    listed = {(m[1], m[2]): m[3] for m in lines if m is not None}
    expected_lines = [f"- `{a}` + `{b}`: {why}" for (a, b), why in outside.items()]
    assert listed == outside, "docs/compatibility.md must list:\n" + "\n".join(expected_lines)


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef)}


def test_every_working_pair_names_a_test_that_exists() -> None:
    for key, (status, evidence) in page_rows().items():
        if status != "works":
            continue
        cited = re.findall(r"(tests/\w+\.py)::(\w+)", evidence)
        assert cited, f"{sorted(key)}: 'works' must name the test that shows it: {evidence}"
        for path, name in cited:
            assert (ROOT / path).exists(), f"{sorted(key)} cites missing {path}"
            assert name in _test_names(ROOT / path), f"{sorted(key)} cites missing {path}::{name}"


COVERING_RUNS: dict[str, list[str]] = {
    "mch_delayed": [
        "checkpoints",
        "delayed_state",
        "inter_host",
        "mch",
        "pipeline_sparse_dist",
        "sparse_engine",
        "sync_every_4",
    ],
    "zch_delayed": [
        "checkpoints",
        "delayed_state",
        "inter_host",
        "mp_zch",
        "pipeline_sparse_dist",
        "sparse_engine",
        "sync_every_4",
    ],
    "scaling_delayed_sparse_dist": [
        "checkpoints",
        "delayed_state",
        "inter_host",
        "momentum_scaling",
        "pipeline_sparse_dist",
        "sparse_engine",
        "sync_every_4",
    ],
    "semi_sync_delayed": [
        "checkpoints",
        "delayed_state",
        "inter_host",
        "momentum_scaling",
        "pipeline_semi_sync",
        "sparse_engine",
        "sync_every_4",
    ],
    "stream_semi_sync": [
        "checkpoints",
        "inter_host",
        "momentum_scaling",
        "pipeline_semi_sync",
        "sparse_engine",
        "stream",
        "sync_every_4",
    ],
    "stream_mch": [
        "checkpoints",
        "inter_host",
        "mch",
        "pipeline_sparse_dist",
        "sparse_engine",
        "stream",
        "sync_every_4",
    ],
    "stream_zch": [
        "checkpoints",
        "inter_host",
        "mp_zch",
        "pipeline_sparse_dist",
        "sparse_engine",
        "stream",
        "sync_every_4",
    ],
    "fully_sharded_sparse_dist": [
        "checkpoints",
        "fully_sharded",
        "inter_host",
        "pipeline_sparse_dist",
    ],
    "fully_sharded_semi_sync": ["checkpoints", "fully_sharded", "inter_host", "pipeline_semi_sync"],
    "semi_sync_defaults": ["pipeline_semi_sync"],
}
"""Trainer runs in one world that together cover every working pair without fault
tolerance (chosen greedily; ``test_covering_runs_cover_every_working_pair`` checks). A pair
of two other options counts only in a run at the base's fixed ``L`` (2 replicas): ``auto``
(the cost model's pick) may pick ``L`` = the world, where nothing is replicated and a replica check holds
vacuously (a stream with momentum scaling left replicas apart and passed that way, whenever
``auto`` picked 1D). ``semi_sync_defaults`` guards a bug these runs found: under
``TrainPipelineSemiSync`` the embedding update lands after DDP's backward and after the next
batch's lookup, and replicas ended 0.5 apart (syncs run inside DDP's backward; touched rows
stamped before a sync)."""
COVERING_RUNS |= {  # auto beside the options of these runs: every (auto, option) pair
    f"auto_{name}": ["auto_group_size", *COVERING_RUNS[name]]
    for name in (
        "stream_mch",
        "stream_zch",
        "scaling_delayed_sparse_dist",
        "fully_sharded_semi_sync",
    )
}


def test_covering_runs_cover_every_working_pair() -> None:
    covered = {
        frozenset(p)
        for run in COVERING_RUNS.values()
        for p in itertools.combinations(run, 2)
        if "auto_group_size" in p or "auto_group_size" not in run
    }
    for key, (status, evidence) in page_rows().items():
        if status == "works" and "fault_tolerance" not in key:
            assert key in covered, f"no covering run combines {sorted(key)}"
            cited = re.search(r"test_covering_run` \[(\w+)\]", evidence)
            assert cited, f"{sorted(key)}: cite the covering run as test_covering_run` [run]"
            run = COVERING_RUNS.get(cited[1], [])
            shown = key <= set(run) and ("auto_group_size" in key or "auto_group_size" not in run)
            assert shown, f"{sorted(key)}: the cited run {cited[1]!r} does not show this pair"


def _replica_check(model: Any) -> float:
    """Largest difference between this rank and replica-rank 0 over every context's shards
    (FULLY_SHARDED materialized) and managed-collision identity tables; 0.0: identical."""
    import torch
    import torch.distributed as dist

    from sparse2d.core.fully_sharded import materialized
    from sparse2d.managed_collision import mc_identity_buffers
    from sparse2d.sync.shards import live_tensors

    worst = torch.zeros((), dtype=torch.float64)
    with materialized(model), torch.no_grad():
        for ctx in model.contexts:
            shards = list(ctx.shards) + list(getattr(ctx.policy.mc, "shards", []) or [])
            tensors = live_tensors(shards, weights=True, states=True)
            tensors += mc_identity_buffers(ctx.policy)
            for tensor in tensors:
                reference = tensor.detach().clone()
                src = dist.get_global_rank(ctx.replica_pg, 0)
                dist.broadcast(reference, src=src, group=ctx.replica_pg)
                diff = (tensor.detach().double() - reference.double()).abs().max()
                worst = torch.maximum(worst, diff if tensor.numel() else worst)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return float(worst)


def _covering_run_on_this_rank(config: str, args: list[str]) -> dict[str, Any]:
    import contextlib
    import io

    import torch.distributed as dist

    from sparse2d.train.loop import Loop
    from sparse2d.train.model_builder import resolve_device

    cfg = load_config(config, args)
    cfg.check_runtime(dist.get_world_size(), dist.get_world_size())
    with contextlib.redirect_stdout(io.StringIO()):
        loop = Loop(cfg, resolve_device(cfg))
        try:
            summary = loop.run()
            summary["replica_max_diff"] = _replica_check(loop.model)
            summary["contexts_replicated"] = [c.num_replicas for c in loop.model.contexts]
        finally:
            loop.model.close()
        dist.barrier()
    return summary


@pytest.mark.slow
@pytest.mark.parametrize("run", sorted(COVERING_RUNS))
def test_covering_run(world4, tmp_path, run: str) -> None:
    """Eight steps of the trainer with every option of ``run`` at once: finite losses, a
    checkpoint written where asked, identical replicas (identity tables too) at the end."""
    names = COVERING_RUNS[run]
    assert refusal(*names) is None, f"{run}: the config refuses {names}: {refusal(*names)}"
    args = overrides(*names) + [
        "train.steps=8",
        "train.log_every=4",
        "train.eval_batches=2",
        "train.eval_every=0",
        "train.progress_bar=false",
        "metrics.tensorboard=false",
        f"run_dir={tmp_path}",
    ]
    summary = world4.run(_covering_run_on_this_rank, str(ROOT / BASE), args, timeout=400)[0]
    assert summary["steps"] == 8
    for key in ("train_loss", "eval_loss"):
        assert math.isfinite(summary[key]), f"{run}: {key}={summary[key]}"
    if "auto_group_size" not in names:  # the base's L: the replica check is never vacuous
        assert min(summary["contexts_replicated"]) == 2, summary["contexts_replicated"]
    assert summary["replica_max_diff"] == 0.0, f"{run}: replicas differ after the final sync"
    if "checkpoints" in names:
        assert list((tmp_path / "checkpoints").glob("step_*")), f"{run}: no checkpoint written"
