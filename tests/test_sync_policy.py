"""SyncOptions validation, engine construction, and the exact hidden sync (``hide``)."""

from __future__ import annotations

import pytest

from sparse2d.errors import ConfigError
from sparse2d.sync.policy import SyncOptions


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
