"""Steps 1-2 of the construction (``resolve_setup``, ``choose_layout``): both call forms resolve
alike, bad calls fail before any collective."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torchrec import EmbeddingCollection
from torchrec.distributed.types import DMPCollectionConfig, ShardingStrategy

from sparse2d.core.collection_setup import choose_layout, fixed_group_size, resolve_setup
from sparse2d.errors import ConfigError
from tests.models import MIXED_TABLES, build_model


def check_resolve() -> dict:
    """Local to each rank: no collective runs (a bad call raises on every rank alike)."""
    model = build_model(MIXED_TABLES)
    ours = resolve_setup(model, (1,), {"device": "cpu"})
    ours_contexts = choose_layout(model, ours, fixed_group_size(ours))
    torchrec = resolve_setup(  # TorchRec's positional form: device, plan, world_size, L, pg
        model, ("cpu", None, 2, 1, None, ShardingStrategy.PER_MODULE), {}
    )
    torchrec_contexts = choose_layout(model, torchrec, fixed_group_size(torchrec))
    errors = []
    for args, kwargs in (
        ((), {"device": "cpu"}),
        ((3,), {"device": "cpu"}),
        ((1,), {"device": "cpu", "replica_layout": "diagonal"}),
        (("auto",), {"device": "cpu"}),
        (
            (1,),
            {
                "device": "cpu",
                "submodule_configs": [
                    DMPCollectionConfig(
                        module=EmbeddingCollection, plan=None, sharding_group_size=2
                    )
                ],
            },
        ),
    ):
        with pytest.raises(ConfigError) as error:
            bad = build_model(MIXED_TABLES)
            setup = resolve_setup(bad, args, kwargs)
            choose_layout(bad, setup, fixed_group_size(setup))
        errors.append(str(error.value))
    return {
        "ours": (
            ours.world_size,
            ours_contexts[0].sharding_group_size,
            ours.device.type,
            ours.pg is dist.group.WORLD,
            ours.has_mc,
            ours.hook is None,
        ),
        "torchrec": (
            torchrec.world_size,
            torchrec_contexts[0].sharding_group_size,
            torchrec_contexts[0].strategy,
            len(torchrec.sharders) > 0,
        ),
        "paths": ours_contexts[0].paths,
        "errors": errors,
        "rank": (ours.rank, dist.get_rank()),
    }


def test_both_call_forms_resolve_and_bad_calls_name_the_value(world2) -> None:
    for result in world2.run(check_resolve):
        assert result["ours"] == (2, 1, "cpu", True, False, True)
        assert result["torchrec"] == (2, 1, ShardingStrategy.PER_MODULE, True)
        assert result["paths"] == ["ebc"]
        required, indivisible, layout, auto, missing = result["errors"]
        assert "sharding_group_size is required" in required
        assert "sharding_group_size=3" in indivisible
        assert "replica_layout='diagonal'" in layout
        assert "'auto' is chosen by the advisor" in auto and "sparse2d.DMPCollection" in auto
        assert "EmbeddingCollection does not occur in the model" in missing
        assert result["rank"][0] == result["rank"][1]


def test_without_a_process_group_the_call_is_refused() -> None:
    if dist.is_initialized():
        pytest.skip("a default process group exists in this process")
    with pytest.raises(ConfigError, match="No default process group is initialized"):
        resolve_setup(torch.nn.Linear(1, 1), (1,), {"device": "cpu"})
