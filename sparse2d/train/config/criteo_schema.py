"""Criteo's column schema and file names, checked by the config before any data is read.

Kept apart from ``data/criteo.py`` (which reads the files) so the config can validate a
Criteo run without importing the data package, and the data package can import the config.
"""

from __future__ import annotations

import os

from sparse2d.train.config.io import bad

KINDS = ("dense", "sparse", "labels")


def check_features(feature_names: list[str], dense_in_features: int) -> None:
    """Criteo models must read Criteo's columns: ``cat_0..cat_25`` and 13 dense features."""
    # here, not at the top: the config loads no torch unless a Criteo config is checked
    from torchrec.datasets.criteo import CAT_FEATURE_COUNT, DEFAULT_CAT_NAMES, INT_FEATURE_COUNT

    unknown = [f for f in feature_names if f not in DEFAULT_CAT_NAMES]
    if unknown:
        raise bad(
            "model.tables",
            unknown,
            f"are not Criteo features; data.source=criteo has {DEFAULT_CAT_NAMES[0]}.."
            f"{DEFAULT_CAT_NAMES[-1]} (one entry with name: cat, count: {CAT_FEATURE_COUNT})",
        )
    if dense_in_features != INT_FEATURE_COUNT:
        raise bad(
            "model.dense_in_features",
            dense_in_features,
            f"must be {INT_FEATURE_COUNT} for data.source=criteo",
        )


def triplet(path: str) -> list[str] | None:
    if path.endswith("_dense.npy"):
        stem = path[: -len("_dense.npy")]
        return [f"{stem}_{kind}.npy" for kind in KINDS]
    return None


def missing_files(path: str) -> list[str]:
    """The files ``path`` needs that do not exist."""
    return [p for p in (triplet(path) or [path]) if not os.path.exists(p)]


def unreadable(path: str) -> str | None:
    """Why ``path`` (or its npy triplet) cannot be read as data, or ``None``."""
    for p in triplet(path) or [path]:
        if os.path.isdir(p):
            return f"{p!r} is a directory; list the data files themselves"
        if not os.access(p, os.R_OK):
            return f"{p!r} is not readable (permissions); chmod it or run as its owner"
        if os.path.getsize(p) == 0:
            return f"{p!r} is empty; give a Criteo TSV (or npy triplet) with rows"
    return None
