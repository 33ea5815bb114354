"""TorchRec's own 2D sharding cases (``torchrec/distributed/tests/test_2d_sharding.py``,
vendored unchanged) against ``sparse2d.DMPCollection`` on 4 gloo ranks.

Each case is TorchRec's: its model, inputs, plan constraints, one training step, the
prediction compared with an unsharded model under TorchRec's tolerances. What differs is
listed in docs/torchrec_suite.md; how it runs, in tests/torchrec_suite/runner.py.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torchrec

from tests.harness import CheckFailed, DistWorld
from tests.torchrec_suite import cases, runner
from tests.torchrec_suite.cases import Case

if runner.release_folder(torchrec.__version__) is None:
    pytest.skip(
        f"TorchRec's cases are vendored for releases {sorted(runner.RELEASES)} "
        f"(tests/torchrec_suite/vendored/PROVENANCE); torchrec {torchrec.__version__} is "
        "installed: vendor its test_2d_sharding.py",
        allow_module_level=True,
    )


def _marks(case: Case, params: dict[str, Any]) -> list[pytest.MarkDecorator]:
    if case.needs_ranks:
        return [
            pytest.mark.skip(
                reason=f"hard-codes world_size={case.needs_ranks}; the "
                "shared worlds have 2 and 4 ranks"
            )
        ]
    if cases.dmp() != "sparse2d":
        return []  # a measurement run (docs/torchrec_suite.md): report what happens
    if "dynamic_2D" in case.method and params["variable_batch_size"]:
        return [pytest.mark.xfail(raises=CheckFailed, strict=True, reason=cases.DYNAMIC_VBS_REASON)]
    return []


PARAMS = [
    pytest.param(
        case, params, id=f"{case.method}-{cases.label(params)}", marks=_marks(case, params)
    )
    for case in cases.CASES
    for params in cases.combinations(case)
]


@pytest.fixture
def torchrec_env() -> Iterator[None]:
    """TorchRec's ``setUp`` writes MASTER_PORT and friends into this process's env."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def run_vendored(world: DistWorld, case: Case, params: dict[str, Any], dmp: str) -> list[float]:
    """TorchRec's ``setUp`` / case body / ``tearDown``; the seconds each rank took."""
    module = runner.vendored_module()
    cls = runner.cpu_class(
        getattr(module, case.cls),
        lambda payload: world.run(runner.run_case, payload, dmp),
        case.world_size_2d,
        case.past_gloo_skip,
    )
    test = cls(case.method)
    test.setUp()
    try:
        runner.inner_test(cls, case.method)(test, **params)
    finally:
        test.tearDown()
    return test.result


@pytest.mark.parametrize(("case", "params"), PARAMS)
def test_torchrec_2d_case(world4: DistWorld, torchrec_env: None, case: Case, params: dict) -> None:
    seconds = run_vendored(world4, case, params, cases.dmp())
    assert len(seconds) == 4


def test_a_missing_sync_fails_a_case(world4: DistWorld, torchrec_env: None) -> None:
    """The suite can see a missing sync: TorchRec's EC table-wise case (no quantized comms)
    fails its own prediction check when the replicas are never averaged. Many cases cannot
    (docs/torchrec_suite.md lists them)."""
    case = next(c for c in cases.CASES if c.method == "test_sharding_ec_tw_2D")
    params = cases.combinations(case)[0]
    assert params["qcomms_config"] is None and not params["variable_batch_size"]
    run_vendored(world4, case, params, "sparse2d")
    with pytest.raises(CheckFailed, match="Tensor-likes are not close"):
        run_vendored(world4, case, params, "sparse2d-no-sync")


def test_rw_variable_batch_is_a_torchrec_bug_fixed_on_gloo(
    world4: DistWorld, torchrec_env: None
) -> None:
    """The row-wise per-rank-batch case fails with TorchRec's own 1D
    ``DistributedModelParallel`` on gloo: ``ReduceScatterV``'s backward in ``comm_ops``
    gathers unequal per-rank sizes, which gloo's allgather refuses. With sparse2d's fix
    (``sparse2d.patches.torchrec_comm_ops``: a padded all-gather on gloo) TorchRec's 1D passes the case too, as
    sparse2d's 2D does in ``test_torchrec_2d_case``."""
    case = next(c for c in cases.CASES if c.method == "test_sharding_rw_2D")
    params = next(p for p in cases.combinations(case) if p["variable_batch_size"])
    with pytest.raises(CheckFailed, match="ProcessGroupGloo::allgather: invalid tensor size") as e:
        run_vendored(world4, case, params, "torchrec-1d-unfixed")
    assert "comm_ops.py" in str(e.value)
    run_vendored(world4, case, params, "torchrec-1d")


def test_dynamic_variable_batch_inputs_fail_unsharded(torchrec_env: None) -> None:
    """The dynamic case's per-rank-batch inputs break TorchRec's own UNSHARDED mixed model:
    every rank but 0 gets 4 dense rows and fewer KJT rows (no sharding involved)."""
    import torch
    from torchrec.distributed.test_utils.test_model import ModelInput
    from torchrec.distributed.test_utils.test_sharding import gen_model_and_input

    module = runner.vendored_module()
    setup = module.TestDynamic2DParallel("test_sharding_dynamic_2D")
    setup.setUp()
    try:
        model, inputs = gen_model_and_input(
            model_class=module.TestMixedEmbeddingSparseArch,
            tables=setup.tables,
            generate=ModelInput.generate,
            weighted_tables=None,
            embedding_groups=setup.embedding_groups,
            world_size=runner.WORLD_SIZE,
            num_float_features=16,
            variable_batch_size=True,
            batch_size=4,
            global_constant_batch=True,
        )
    finally:
        setup.tearDown()
    model.train(False)
    local = inputs[0][1]
    assert [i.idlist_features.stride() for i in local] == [4, 3, 2, 1]
    assert [i.float_features.shape[0] for i in local] == [4, 4, 4, 4]
    with torch.no_grad():
        model(local[0])
        for rank_input in local[1:]:
            with pytest.raises(RuntimeError, match="Sizes of tensors must match"):
                model(rank_input)


def test_vendored_files_unchanged() -> None:
    """The vendored files are byte-for-byte the blobs PROVENANCE names (git hashes)."""
    vendored = runner.VENDORED
    entries = {}
    for line in (vendored / "PROVENANCE").read_text().splitlines():
        if line.startswith("blob "):
            _, blob, name = line.split()
            entries[name] = blob
    releases = {f"{folder}/test_2d_sharding.py" for folder in runner.RELEASES.values()}
    assert set(entries) >= releases | {"test_sequence_model.py", "LICENSE"}
    for name, blob in entries.items():
        actual = subprocess.run(
            ["git", "hash-object", str(vendored / name)], check=True, capture_output=True, text=True
        ).stdout.strip()
        assert actual == blob, f"{name} differs from TorchRec's blob {blob}"
    assert Path(vendored / "__init__.py").read_bytes() == b""
