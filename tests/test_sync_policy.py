"""``sync.policy``: SyncOptions validation, engine construction, the exact hidden sync
(``hide``), and where a started part lands (``InFlight``): each landing point on real syncs,
and a channel that keeps its parts until it commits or discards them."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from sparse2d.errors import ConfigError
from sparse2d.sync.engines.rows import row_payload
from sparse2d.sync.policy import InFlight, InWorldChannel, SyncOptions, SyncPolicy
from sparse2d.sync.shards import live_tensors
from tests.models import MIXED_TABLES, adagrad_2d, make_batch


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"every": 0}, "every=0"),
        ({"every": 2.5}, "every=2.5"),
        ({"every": True}, "every=True"),
        ({"divergence_every": -1}, "divergence_every=-1"),
        ({"divergence_rows": 0}, "divergence_rows=0"),
        ({"engine": "blocked"}, "engine='blocked'"),
        ({"hide": 1}, "hide=1"),
        ({"momentum_scaling": 1}, "momentum_scaling=1"),
        ({"delayed_optimizer_state": True, "include_optimizer_state": False}, "delayed_optim"),
        ({"momentum_scaling": True, "include_optimizer_state": False}, "momentum_scaling"),
    ],
)
def test_bad_options_name_the_field(kwargs: dict, names: str) -> None:
    with pytest.raises(ConfigError, match=names.replace("(", r"\(")):
        SyncOptions(**kwargs)


def test_good_options_combine() -> None:
    options = SyncOptions(
        every=16,
        delayed_optimizer_state=True,
        momentum_scaling=True,
        engine="sparse",
        divergence_every=4,
    )
    assert options.every == 16 and options.engine == "sparse"


@pytest.mark.parametrize(("name", "value"), [("overlap", True), ("compression", "bf16")])
def test_a_retired_option_is_refused_with_why(name: str, value: object) -> None:
    """``overlap`` and ``compression`` were retired by measurement (issue 56): naming one says
    so, in one line, from the library and from the trainer's config alike, never ignored."""
    from sparse2d.train.config import load_config

    with pytest.raises(ConfigError, match=rf"^{name} was retired: .*cluster-options") as info:
        SyncOptions(**{name: value})
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match=rf"^parallel\.sync\.{name} was retired: "):
        load_config("configs/tiny_cpu.yaml", [f"parallel.sync.{name}={value}"])


def test_one_default_for_the_library_and_the_trainer() -> None:
    """The trainer's ``parallel.sync`` defaults are ``SyncOptions()``: the dense engine, hidden
    syncs (a config that leaves the section out gets exactly the library's options)."""
    from sparse2d.train.config.parallel import ParallelConfig

    assert ParallelConfig().sync == SyncOptions()
    assert (SyncOptions().engine, SyncOptions().hide) == ("dense", True)


def test_options_are_keyword_only_and_slotted() -> None:
    with pytest.raises(TypeError):
        SyncOptions(4)  # type: ignore[misc]
    with pytest.raises(AttributeError):
        SyncOptions().evry = 3  # type: ignore[attr-defined]


def check_engine_kinds() -> list[tuple[str, float | None]]:
    from sparse2d import DMPCollection
    from sparse2d.sync.policy import make_engine
    from tests.models import MIXED_TABLES, build_model, constraints_for

    model = DMPCollection(
        build_model(MIXED_TABLES), 2, device="cpu", constraints=constraints_for(MIXED_TABLES)
    )
    kinds = []
    for kind in ("dense", "sparse", "auto"):
        engine = make_engine(kind, model.shard_states, model.replica_pg)
        kinds.append((type(engine).__name__, getattr(engine, "crossover", None)))
        if hasattr(engine, "close"):
            engine.close()
    return kinds


def test_engine_kinds(world4) -> None:
    kinds = world4.run(check_engine_kinds)[0]
    assert kinds[:2] == [
        ("DenseEngine", None),
        ("SparseEngine", 1.0),  # "sparse" never falls back to dense
    ]
    name, crossover = kinds[2]  # "auto": crossover derived from the measured copy costs
    assert name == "AutoEngine" and 0.05 <= crossover <= 1.0


def check_hidden_sync_is_exact(
    engine: str, every: int, momentum: bool, in_place: bool = False
) -> list[bool]:
    """``hide=True`` lands before the next lookup and equals the blocking sync bit for bit
    (``in_place``: the hidden one averages the live views, the blocking one copies)."""
    from sparse2d.sync.engines import base as engines
    from sparse2d.sync.policy import SyncPolicy
    from tests.models import SPARSE_SYNC_TABLES, train
    from tests.test_sync_engines_sparse import _assert_replicas_equal, _assert_same, _model

    models = [_model(SPARSE_SYNC_TABLES, "rowwise_adagrad") for _ in range(2)]
    policies = [
        SyncPolicy(
            m.shard_states,
            m.replica_pg,
            m.num_replicas,
            SyncOptions(every=every, engine=engine, hide=hide, momentum_scaling=momentum),
        )
        for m, hide in zip(models, (False, True), strict=True)
    ]
    in_flight: list[bool] = []

    def hidden_step(step: int) -> None:
        policies[1].step(step)
        in_flight.append(policies[1].in_flight)

    train(models[0], SPARSE_SYNC_TABLES, 6, after_step=policies[0].step)
    saved = engines.IN_PLACE_MIN_BYTES
    engines.IN_PLACE_MIN_BYTES = 0 if in_place else saved
    try:
        if engine == "dense":  # (a dense payload has no side effects; auto's would)
            assert policies[1].engine.payload(True, True, in_place=True).in_place == in_place
        train(models[1], SPARSE_SYNC_TABLES, 6, after_step=hidden_step)
        assert policies[1].in_flight  # the last sync is still in flight ...
        policies[1].land()  # ... and lands exactly
    finally:
        engines.IN_PLACE_MIN_BYTES = saved
    _assert_same(models[0], models[1])
    _assert_replicas_equal(models[1])
    for policy in policies:
        policy.close()
    return in_flight


@pytest.mark.parametrize(
    ("engine", "every", "momentum", "in_place"),
    [("dense", 1, False, False), ("auto", 2, True, False), ("dense", 1, False, True)],
)
def test_hidden_sync_bit_identical_to_blocking(
    world4, engine: str, every: int, momentum: bool, in_place: bool
):
    for in_flight in world4.run(check_hidden_sync_is_exact, engine, every, momentum, in_place):
        # in flight exactly after sync steps; the next step's lookup landed it
        assert in_flight == [(s + 1) % every == 0 for s in range(6)], in_flight


# ---- where a started part lands (``InFlight``): unit checks on real payloads --------------


def _in_flight(live: torch.Tensor, average: list[float], **kwargs: object) -> InFlight:
    """A started part of ``live`` whose replica average is ``average`` (the collective is not
    the subject here: the payload's copy already holds the average)."""
    payload = row_payload([(live, None)])
    snapshot = [b.clone() for b in payload.buffers] if kwargs.pop("delayed", False) else None
    payload.buffers[0].copy_(torch.tensor(average))
    return InFlight([], payload, snapshot=snapshot, **kwargs)  # type: ignore[arg-type]


def test_a_part_lands_once_drops_once_and_never_crosses() -> None:
    live = torch.tensor([1.0, 2.0])
    landed: list[int] = []
    dropped: list[int] = []
    part = _in_flight(live, [3.0, 4.0], landed=lambda: landed.append(1))
    assert part.land() >= 0.0 and part.land() == 0.0
    assert landed == [1] and live.tolist() == [3.0, 4.0]  # written back once
    with pytest.raises(RuntimeError, match="cannot be dropped"):
        part.drop()

    gone = _in_flight(live, [9.0, 9.0], dropped=lambda: dropped.append(1))
    gone.drop()
    gone.drop()
    assert dropped == [1] and live.tolist() == [3.0, 4.0]  # dropped once, never written
    with pytest.raises(RuntimeError, match="cannot land"):
        gone.land()


def test_a_delayed_part_keeps_the_updates_made_while_in_flight() -> None:
    live = torch.tensor([1.0, 2.0])
    part = _in_flight(live, [7.0, 8.0], delayed=True)
    live.add_(torch.tensor([1.0, 0.0]))  # training goes on while the all-reduce runs
    part.land()
    assert live.tolist() == [8.0, 8.0]  # the average plus the update made meanwhile


def test_landing_runs_on_the_average_and_adds_the_updates_after() -> None:
    live = torch.tensor([1.0, 2.0])
    seen: list[list[float]] = []
    part = _in_flight(live, [7.0, 8.0], delayed=True, landed=lambda: seen.append(live.tolist()))
    live.add_(torch.tensor([1.0, 0.0]))
    part.land()
    assert seen == [[7.0, 8.0]]  # what landing does sees one value on every replica
    assert live.tolist() == [8.0, 8.0]


def check_landing_outside_a_sync_is_reported() -> list[float]:
    """A hidden sync lands in the next lookup's hook, outside any sync call: the next sync
    reports that time as ``wait_seconds`` (the trainer adds it to its sync time; a hidden
    burst's 2.1 s landing on the emulated cluster was in no report it read), and a sync
    call's own landing stays in its ``seconds``, never in both."""
    from tests.models import train

    model = adagrad_2d(hide=True)
    policy = model.contexts[0].policy
    held: list[float] = []  # landings outside a sync call, timed
    inside = [False]
    land, sync = policy.land, policy._sync

    def timed_land() -> None:  # the real landing, timed where the lookup's hook calls it
        began = time.perf_counter()
        land()
        if not inside[0]:
            held.append(time.perf_counter() - began)

    def flagged_sync(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        inside[0] = True
        try:
            return sync(*args, **kwargs)
        finally:
            inside[0] = False

    policy.land, policy._sync = timed_land, flagged_sync  # type: ignore[method-assign]
    reports = []
    train(model, MIXED_TABLES, 3, after_step=lambda step: reports.append(model.maybe_sync(step)))
    model.close()
    hook_s = sum(held[:2])  # the lookups of steps 1 and 2 landed syncs 0 and 1
    reported = reports[1].wait_seconds + reports[2].wait_seconds
    return [len(held), hook_s, reported, reports[0].wait_seconds]


def test_a_landing_outside_a_sync_is_reported_by_the_next(world4) -> None:
    for count, hook_s, reported, first in world4.run(check_landing_outside_a_sync_is_reported):
        assert count >= 2 and first < 1e-3  # nothing was in flight before sync 0
        assert hook_s > 0 and hook_s <= reported <= hook_s + 0.05, (hook_s, reported)


def check_overlapped_scaling_ends_identical(options: dict, engine: str) -> float:
    """Momentum scaling's reference must be one value on every replica: parts that land
    after training went on (delayed state, a stream's fragments) took it with each replica's
    own updates, and a later full sync left replicas apart (1.7e-05, a covering run)."""
    from tests.models import SPARSE_SYNC_TABLES, train
    from tests.test_sync_engines_sparse import _model

    model = _model(SPARSE_SYNC_TABLES, "rowwise_adagrad")
    sync = SyncOptions(every=4, hide=True, momentum_scaling=True, engine=engine, **options)
    policy = SyncPolicy(model.shard_states, model.replica_pg, model.num_replicas, sync)
    train(model, SPARSE_SYNC_TABLES, 7, after_step=policy.step)
    policy.sync_now()
    worst = 0.0
    for tensor in live_tensors(model.shard_states, True, True):
        average = tensor.clone()
        dist.all_reduce(average, dist.ReduceOp.AVG, group=model.replica_pg)
        worst = max(worst, float((tensor - average).abs().max()) if tensor.numel() else 0.0)
    policy.close()
    return worst


@pytest.mark.parametrize("engine", ["dense", "sparse", "auto"])
@pytest.mark.parametrize(
    "options", [{"delayed_optimizer_state": True}, {"stream": True}], ids=["delayed", "stream"]
)
def test_overlapped_momentum_scaling_ends_identical(world4, options: dict, engine: str) -> None:
    assert world4.run(check_overlapped_scaling_ends_identical, options, engine) == [0.0] * 4


# ---- real syncs on the 2x2 gloo mesh: every landing point, and a keeping channel ---------


class Keeping(InWorldChannel):
    """The in-world replica group, keeping every blocking part until ``commit`` (land) or
    ``discard`` (drop): what a loop that votes on its steps builds (fault tolerance's
    ``ManagedChannel`` keeps its parts the same way)."""

    keeps = True

    def __init__(self, pg: dist.ProcessGroup | None) -> None:
        super().__init__(pg)
        self.held: list[InFlight] = []

    def hand(self, part: InFlight) -> None:
        self.held.append(part)

    def settle(self) -> None:
        return None

    def commit(self) -> None:
        held, self.held = self.held, []
        for part in held:
            part.land()

    def discard(self) -> None:
        held, self.held = self.held, []
        for part in held:
            part.drop()


def _install(model, channel: InWorldChannel, **options: object) -> SyncPolicy:
    """A policy over ``channel`` as the model's own (its surfaces land it)."""
    local = model.sync_policy
    policy = SyncPolicy(
        local.shards,
        model.replica_pg,
        model.num_replicas,
        SyncOptions(engine="dense", **options),  # type: ignore[arg-type]
        global_pg=dist.group.WORLD,
        channel=channel,
    )
    local.close()
    model.sync_policy = policy
    return policy


def _diverge(model, shards) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Make each replica's values its own; return them and their replica average."""
    with torch.no_grad():
        for t in live_tensors(shards, True, True):
            t.add_(float(dist.get_rank()) + 1.0)
    own = [t.clone() for t in live_tensors(shards, True, True)]
    average = [t.clone() for t in own]
    for t in average:
        dist.all_reduce(t, op=dist.ReduceOp.AVG, group=model.replica_pg)
    return own, average


def _equal(shards, expected: list[torch.Tensor]) -> bool:
    for live, want in zip(live_tensors(shards, True, True), expected, strict=True):
        torch.testing.assert_close(live, want)
    return True


def _differ(shards, expected: list[torch.Tensor]) -> bool:
    live = live_tensors(shards, True, True)
    return any(not torch.equal(a, b) for a, b in zip(live, expected, strict=True))


def check_each_point_lands() -> list[str]:
    """A hidden sync, still in flight (its average not in the shards), landed by each point
    that lands it; then a blocking one, landed before the sync returns."""
    kjt, dense, _ = make_batch(MIXED_TABLES, 0, dist.get_rank())
    points = {
        "lookup": lambda model, policy: model(kjt, dense),
        "surface": lambda model, policy: model.state_dict(),
        "finish": lambda model, policy: model.finish_sync(),
        "next sync": lambda model, policy: policy.sync_now(0),
        "reset": lambda model, policy: policy.reset(),
    }
    landed = []
    with adagrad_2d(engine="dense") as model:
        policy = _install(model, InWorldChannel(model.replica_pg), hide=True)
        shards = policy.shards
        for name, reach in points.items():
            _, average = _diverge(model, shards)
            policy.step(0)  # hidden: in flight until a point lands it
            assert policy.in_flight and _differ(shards, average), name
            with torch.no_grad():
                reach(model, policy)
            assert not policy.in_flight and _equal(shards, average), name
            landed.append(name)
        _, average = _diverge(model, shards)
        policy.sync_now(0)  # blocking: the channel lands it before the sync returns
        assert not policy.in_flight and _equal(shards, average)
        landed.append("sync")
    return landed


def test_each_landing_point_lands(world4) -> None:
    for out in world4.run(check_each_point_lands):
        assert out == ["lookup", "surface", "finish", "next sync", "reset", "sync"], out


def check_commit_and_discard() -> dict[str, list[str]]:
    """A kept sync: untouched until its channel decides; ``commit`` lands the averages,
    ``discard`` leaves every shard's own values; a second decision finds nothing kept."""
    out: dict[str, list[str]] = {}
    with adagrad_2d(engine="dense") as model:
        channel = Keeping(model.replica_pg)
        policy = _install(model, channel)
        shards = policy.shards
        for outcome in ("discard", "commit"):
            own, average = _diverge(model, shards)
            policy.sync_now(0)
            held = list(channel.held)
            assert held and all(p.state == "started" for p in held)
            assert _equal(shards, own)  # in copies only
            model.state_dict()  # a surface lands nothing a channel keeps
            assert _equal(shards, own) and channel.held
            getattr(channel, outcome)()
            getattr(channel, outcome)()  # nothing kept any more: nothing happens
            assert _equal(shards, own if outcome == "discard" else average)
            out[outcome] = [p.state for p in held]
    return out


def test_commit_writes_averages_and_discard_keeps_own_values(world4) -> None:
    for out in world4.run(check_commit_and_discard):
        assert out == {"discard": ["dropped"], "commit": ["landed"]}, out
