"""Which of TorchRec's 2D cases run here, with which parameters, and what is expected.

Parameters come from each case's own ``@given`` strategies (read from the vendored
module, so a changed upstream strategy changes what runs here), as their full cartesian
product less the kernels a CPU cannot run (UVM and UVM caching: CUDA-only). TorchRec
itself draws ONE example per case per run (``max_examples=1``); here every combination
runs, every time, in a fixed order.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Any

from tests.torchrec_suite import runner

CPU_KERNELS = {"fused"}
"""``EmbeddingComputeKernel`` values a CPU runs (UVM / UVM caching are CUDA-only)."""

DYNAMIC_VBS_REASON = (
    "TorchRec's test data: with variable_batch_size and global_constant_batch the "
    "mixed EBC+EC model's local inputs carry 4 dense rows but 1-3 KJT rows, so the "
    "UNSHARDED model fails on them too (test_dynamic_variable_batch_inputs_fail_unsharded)"
)
DMP_ENV = "SPARSE2D_TORCHREC_DMP"
"""Which model the cases build: ``sparse2d`` (default) or ``sparse2d-no-sync`` (replicas
never averaged: the cases that still pass cannot detect a missing sync)."""


@dataclass(frozen=True)
class Case:
    cls: str
    method: str
    world_size_2d: int = runner.WORLD_SIZE_2D
    """Ranks per sharding group of the main module at 4 ranks (TorchRec: 4 of 8)."""
    fully_sharded: bool = False
    needs_ranks: int = 0
    """Ranks the case hard-codes (not ours: it is not run)."""
    past_gloo_skip: bool = False
    """The case skips itself when ``self.backend == "gloo"`` for a TorchRec limitation
    that is measured here instead (see ``runner.cpu_class``)."""


CASES = [
    Case("TestEmbeddingBagCollection2DParallel", "test_sharding_cw_2D"),
    Case("TestEmbeddingBagCollection2DParallel", "test_sharding_tw_2D"),
    Case("TestEmbeddingBagCollection2DParallel", "test_sharding_grid_2D"),
    Case("TestEmbeddingBagCollection2DParallel", "test_sharding_rw_2D", past_gloo_skip=True),
    Case("TestEmbeddingBagCollection2DParallel", "test_sharding_twrw_2D"),
    Case("TestEmbeddingCollection2DParallel", "test_sharding_ec_rw_2D"),
    Case("TestEmbeddingCollection2DParallel", "test_sharding_ec_cw_2D"),
    Case("TestEmbeddingCollection2DParallel", "test_sharding_ec_tw_2D"),
    # The EC submodule's group size is hard-coded 2: the main module gets the whole world
    # (4) so the two contexts still have different group sizes, as upstream (4 and 2 of 8).
    Case("TestDynamic2DParallel", "test_sharding_dynamic_2D", world_size_2d=4),
    Case("TestDynamic2DParallel", "test_fully_sharded_dynamic_2D", 4, fully_sharded=True),
    Case("TestDynamic2DParallel", "test_partially_fully_sharded_dynamic_2D", 4, True),
    Case("TestFullySharded2DEBCParallel", "test_fully_sharded_cw", fully_sharded=True),
    Case("TestFullySharded2DEBCParallel", "test_fully_sharded_rw", fully_sharded=True),
    Case("TestFullySharded2DEBCParallel", "test_fully_sharded_twrw", fully_sharded=True),
    Case("TestFullySharded2DEBCParallel", "test_fully_sharded_tw", fully_sharded=True),
    Case(
        "TestFullySharded2DEBCParallel",
        "test_fully_sharded_cw_uneven",
        fully_sharded=True,
        needs_ranks=6,
    ),
    Case("TestFullySharded2DECParallel", "test_fully_sharded_sequence_cw", fully_sharded=True),
    Case("TestFullySharded2DECParallel", "test_fully_sharded_sequence_rw", fully_sharded=True),
    Case("TestFullySharded2DECParallel", "test_fully_sharded_sequence_tw", fully_sharded=True),
    Case(
        "TestFullySharded2DECParallel",
        "test_fully_sharded_sequence_cw_uneven",
        fully_sharded=True,
        needs_ranks=6,
    ),
]


def _values(strategy: Any) -> list[Any]:
    """Every value a ``just`` / ``sampled_from`` / ``booleans`` strategy can draw."""
    inner = getattr(strategy, "wrapped_strategy", strategy)
    kind = type(inner).__name__
    if kind == "JustStrategy":
        return [inner.value]
    if kind == "SampledFromStrategy":
        return list(inner.elements)
    if kind == "BooleansStrategy":
        return [False, True]
    raise TypeError(f"cannot enumerate a {kind}: extend cases._values")


def combinations(case: Case) -> list[dict[str, Any]]:
    """The case's parameter combinations a CPU can run, in the strategies' order."""
    module = runner.vendored_module()
    given = getattr(module, case.cls).__dict__[case.method].hypothesis._given_kwargs
    names = list(given)
    out = []
    for values in itertools.product(*(_values(given[n]) for n in names)):
        params = dict(zip(names, values))
        if params.get("kernel_type", "fused") in CPU_KERNELS:
            out.append(params)
    return out


def label(params: dict[str, Any]) -> str:
    """A short test id for one combination."""
    short = {
        "qcomms_config": lambda v: "qcomms" if v is not None else "",
        "apply_optimizer_in_backward_config": lambda v: "aob" if v is not None else "",
        "variable_batch_size": lambda v: "vbs" if v else "",
        "variable_batch_per_feature": lambda v: "vbe" if v else "",
        "use_inter_host_allreduce": lambda v: "inter" if v else "intra",
        "custom_all_reduce": lambda v: "hook" if v else "",
    }
    parts = [short[k](v) for k, v in params.items() if k in short]
    return "-".join(p for p in parts if p) or "base"


def dmp() -> str:
    return os.environ.get(DMP_ENV, "sparse2d")
