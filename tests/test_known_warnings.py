"""Known upstream warnings are silenced by message, and nothing else is.

``pyproject.toml`` (pytest) and ``sparse2d.known_warnings`` (trainer, test workers) list the
same filters; a warning that is not on the list, even from the same library and category,
still shows.
"""

from __future__ import annotations

import warnings

import tomllib

from sparse2d.known_warnings import KNOWN_WARNINGS, ignore_known_warnings
from tests.conftest import ROOT

EXAMPLES = (  # per KNOWN_WARNINGS entry, in order: a message as the library words it, and where
    (
        "\x1b[93m\n        Failed to import: fbgemm_gpu.x.lookup_adam_ssd\n",
        "fbgemm_gpu.split_embedding_codegen_lookup_invokers",
    ),
    (
        "\x1b[93m\n    The Python module fbgemm_gpu.split_table_batched_embeddings_ops is now "
        "DEPRECATED and will be removed",
        "fbgemm_gpu.split_table_batched_embeddings_ops",
    ),
    (
        "`torch.jit.interface` is deprecated. Please use `torch.compile` instead.",
        "torch.jit._script",
    ),
    (
        "`torch.jit.script` is deprecated. Please switch to `torch.compile` or `torch.export`.",
        "torch.jit._script",
    ),
    (
        "distutils Version classes are deprecated. Use packaging.version instead.",
        "torchmetrics.utilities.imports",
    ),
    (
        "HeuristicalStorageReservation is known to cause issues, particularly during dry run",
        "torchrec.distributed.planner.planners",
    ),
    (
        "`broadcast_buffers` is deprecated. Use `forward_sync_buffers` instead. IMPORTANT: ...",
        "torchrec.distributed.model_parallel",
    ),
    (
        "To copy construct from a tensor, it is recommended to use sourceTensor.detach().clone()",
        "torchrec.modules.hash_mc_modules",
    ),
    (
        "Local function is not supported by pickle, please use regular python function",
        "torch.utils.data.datapipes.iter.callable",
    ),
)


def _shown(message: str, category: type[Warning], module: str) -> bool:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ignore_known_warnings()
        warnings.warn_explicit(
            message, category, f"{module.replace('.', '/')}.py", 1, module=module
        )
    return bool(seen)


def test_pyproject_lists_the_same_filters() -> None:
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    # pytest's ini form: action:message:category:module
    lines = [f"ignore:{k.message}:{k.category.__name__}:{k.module}" for k in KNOWN_WARNINGS]
    assert ini["filterwarnings"] == lines


def test_each_known_warning_is_silenced() -> None:
    assert len(EXAMPLES) == len(KNOWN_WARNINGS)
    for known, (message, module) in zip(KNOWN_WARNINGS, EXAMPLES):
        assert not _shown(message, known.category, module), known.message


def test_other_warnings_still_show() -> None:
    for category in (DeprecationWarning, UserWarning, FutureWarning):
        for module in [m for _, m in EXAMPLES] + ["sparse2d.sync.policy"]:
            assert _shown("a new warning nobody has seen", category, module), (category, module)
    # a known message in another category or from another library is not hidden
    assert _shown(EXAMPLES[6][0], UserWarning, "sparse2d.managed_collision.merge")
    assert _shown(EXAMPLES[4][0], UserWarning, "torchrec.distributed.planner.planners")
