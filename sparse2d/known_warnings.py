"""The upstream warnings known to be noise here, each silenced by its message, never by category.

TorchRec, FBGEMM and torch warn about their own deprecations and defaults on every import or
plan; silencing every ``DeprecationWarning``/``UserWarning`` would also hide a new warning
that matters (a deprecation we call, a copy that aliases). The trainer and the test workers
call :func:`ignore_known_warnings`; ``pyproject.toml``'s pytest ``filterwarnings`` lists the
same entries (``tests/test_known_warnings.py`` keeps the two equal). Importing sparse2d
installs no filter: a library leaves that to its application.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KnownWarning:
    message: str
    """Regex matched at the start of the message (``(?s)`` lets ``.*`` cross newlines)."""
    category: type[Warning]
    module: str
    """Regex matched at the start of the warning's module (where it is attributed)."""
    why: str


KNOWN_WARNINGS = (
    KnownWarning(
        r"(?s).*Failed to import",
        DeprecationWarning,
        "fbgemm_gpu",
        "the CPU wheel lacks the SSD/GPU lookup modules; sparse2d never uses them",
    ),
    KnownWarning(
        r"(?s).*split_table_batched_embeddings_ops is now DEPRECATED",
        DeprecationWarning,
        "fbgemm_gpu",
        "TorchRec 1.8 imports FBGEMM's old module path",
    ),
    KnownWarning(
        r"`torch\.jit\.(script|interface)` is deprecated",
        DeprecationWarning,
        "torch",
        "TorchRec and FBGEMM script helpers at import (torch 2.13)",
    ),
    KnownWarning(
        r"`torch\.jit\.(script|interface)` is deprecated",
        FutureWarning,
        "torch",
        "the same deprecation, a FutureWarning since torch 2.14 (the TORCHREC=1.9 set)",
    ),
    KnownWarning(
        r"distutils Version classes are deprecated",
        DeprecationWarning,
        "torchmetrics",
        "TorchRec's metrics import an old torchmetrics helper",
    ),
    KnownWarning(
        r"HeuristicalStorageReservation is known to cause issues",
        FutureWarning,
        "torchrec",
        "TorchRec's planner default; sparse2d's plans are checked against device memory",
    ),
    KnownWarning(
        r"`broadcast_buffers` is deprecated",
        FutureWarning,
        "torchrec",
        "TorchRec 1.8's DDP wrapper passes broadcast_buffers=False to torch 2.13's DDP",
    ),
    KnownWarning(
        r"To copy construct from a tensor",
        UserWarning,
        "torchrec",
        "TorchRec's MP-ZCH module (hash_mc_modules.py) wraps a tensor in torch.tensor()",
    ),
    KnownWarning(
        r"Local function is not supported by pickle",
        UserWarning,
        "torch.utils.data",
        "the data pipelines map a local function; they are never pickled (no workers)",
    ),
)


def ignore_known_warnings() -> None:
    """Silence :data:`KNOWN_WARNINGS` in this process; every other warning still shows."""
    for known in KNOWN_WARNINGS:
        warnings.filterwarnings(
            "ignore", message=known.message, category=known.category, module=known.module
        )
