"""Criteo 1TB / Kaggle TSV data through TorchRec's Criteo utilities.

Each TSV file is converted once to TorchRec's npy triplet (``BinaryCriteoUtils.tsv_to_npys``)
and cached; triplets already on disk are read as they are. Rows are addressed by global sample
index like the synthetic data (wrapping at the end of the files), because TorchRec's own
datapipe deals batches round-robin and cannot restart at a step. Categorical ids are hashed
into each table by ``id % rows``.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torchrec.datasets.criteo import (
    DEFAULT_CAT_NAMES,
    BinaryCriteoUtils,
)
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from sparse2d.errors import ConfigError
from sparse2d.train.config.criteo_schema import KINDS, triplet
from sparse2d.train.config.data import CriteoConfig
from sparse2d.train.config.model import TableSpec
from sparse2d.train.data.criteo_rows import check_rows


def cached_triplet(path: str, cache_dir: str) -> list[str]:
    """Where the npy conversion of TSV ``path`` lives (keyed by path, size and mtime)."""
    existing = triplet(path)
    if existing is not None:
        return existing
    stat = os.stat(path)
    key = f"{os.path.abspath(path)}:{stat.st_size}:{stat.st_mtime_ns}".encode()
    stem = os.path.join(cache_dir, f"{os.path.basename(path)}-{hashlib.sha1(key).hexdigest()[:12]}")
    return [f"{stem}_{kind}.npy" for kind in KINDS]


def prepare(cfg: CriteoConfig, cache_dir: str) -> list[str]:
    """Convert every TSV not yet cached (one rank per host: see ``prepare_everywhere``).

    Bad rows are skipped (``criteo_rows``); returns one line per file that had some.
    """
    os.makedirs(cache_dir, exist_ok=True)
    skipped = []
    for path in dict.fromkeys([*cfg.train_files, *cfg.eval_files]):
        out = cached_triplet(path, cache_dir)
        report = f"{out[0][: -len('_dense.npy')]}_skipped.txt"
        if not all(os.path.exists(p) for p in out):
            source, rows = check_rows(path, f"{report[:-4]}.tsv")
            tmp = [f"{p[:-4]}.tmp{os.getpid()}.npy" for p in out]
            BinaryCriteoUtils.tsv_to_npys(source, *tmp, dataset_name="criteo_1tb")
            if source != path:
                os.remove(source)
            if rows.skipped:  # kept beside the cache: later runs report it too
                with open(report, "w") as f:
                    f.write(rows.describe())
            for src, dst in zip(tmp, out):
                os.replace(src, dst)
        if os.path.exists(report):
            with open(report) as f:
                skipped += [line for line in f.read().splitlines() if line]
    return skipped


def prepare_everywhere(cfg: CriteoConfig, cache_dir: str, local_rank: int) -> list[str]:
    """``prepare`` on local rank 0 of each host; every rank learns any failure (collective),
    so a bad file stops all ranks with the same error instead of leaving them in a barrier."""
    outcome: dict[str, Any] = {"skipped": [], "error": ""}
    if local_rank == 0:
        try:
            outcome["skipped"] = prepare(cfg, cache_dir)
        except (ConfigError, OSError, ValueError) as error:
            outcome["error"] = f"{type(error).__name__}: {error}"
    every: list[dict[str, Any] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(every, outcome)
    errors = [o["error"] for o in every if o and o["error"]]
    if errors:
        raise ConfigError(f"preparing the Criteo data failed: {errors[0]}")
    return sorted({line for o in every if o for line in o["skipped"]})


class CriteoFiles:
    """Memory-mapped npy triplets, addressed by one global row index (wrapping)."""

    def __init__(self, paths: list[str], cache_dir: str) -> None:
        self.parts = [
            [np.load(p, mmap_mode="r") for p in cached_triplet(path, cache_dir)] for path in paths
        ]
        sizes = [len(dense) for dense, _, _ in self.parts]
        for path, size in zip(paths, sizes):
            if size == 0:
                raise ConfigError(
                    f"data.criteo file {path!r} holds no rows; give a non-empty file."
                )
        self.starts = np.cumsum([0, *sizes])
        self.rows = int(self.starts[-1])

    def take(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        index = index % self.rows
        part = np.searchsorted(self.starts, index, side="right") - 1
        out = []
        for kind in range(3):
            first = self.parts[0][kind]
            arr = np.empty((len(index), *first.shape[1:]), dtype=first.dtype)
            for p in np.unique(part):
                mask = part == p
                arr[mask] = self.parts[p][kind][index[mask] - self.starts[p]]
            out.append(arr)
        return out[0], out[1], out[2]


class CriteoBatches:
    """Batches of Criteo rows for the model's features."""

    def __init__(self, files: CriteoFiles, tables: list[TableSpec]) -> None:
        self.files = files
        self.keys = [f for t in tables for f in t.features]
        self.columns = np.array([DEFAULT_CAT_NAMES.index(f) for f in self.keys])
        self.hash_sizes = np.array([t.rows for t in tables for _ in t.features], dtype=np.int64)

    def rows(self, start: int, count: int) -> Batch:
        dense, sparse, labels = self.files.take(np.arange(start, start + count, dtype=np.int64))
        ids = np.asarray(sparse[:, self.columns], dtype=np.int64) % self.hash_sizes
        kjt = KeyedJaggedTensor(
            keys=self.keys,
            values=torch.from_numpy(np.ascontiguousarray(ids.T).reshape(-1)),
            lengths=torch.ones(len(self.keys) * count, dtype=torch.int32),
        )
        return Batch(
            dense_features=torch.from_numpy(np.asarray(dense, dtype=np.float32)),
            sparse_features=kjt,
            labels=torch.from_numpy(np.asarray(labels, dtype=np.float32).reshape(-1)),
        )
