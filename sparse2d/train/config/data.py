"""Trainer configuration, ``data`` section: synthetic planted-signal data or Criteo files."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from sparse2d.train.config.io import bad, positive


@dataclass(kw_only=True, slots=True)
class SyntheticConfig:
    """Planted-signal synthetic CTR data (a deterministic function of seed and sample index)."""

    zipf_exponent: float = 1.1
    """Exponent of the Zipf-like id frequencies (real CTR ids: about 1.0-1.2)."""
    ids_per_feature: int = 1
    """Most ids in one feature's bag; bag lengths are uniform in 1..this."""
    signal_rows: int = 32
    """Hottest rows per table that carry a planted effect on the logit; the rest carry none."""
    sparse_weight: float = 0.6
    """Standard deviation of the planted per-row effects."""
    dense_signal: int = 4
    """Dense features with a planted linear effect (the first N)."""
    dense_weight: float = 0.5
    """Standard deviation of the planted dense coefficients."""
    bias: float = -1.0
    """Planted logit bias (sets the click rate; -1.0 gives about 30%)."""

    def __post_init__(self) -> None:
        positive(self, "zipf_exponent", "ids_per_feature", "signal_rows")
        positive(self, "sparse_weight", "dense_weight", "dense_signal", allow_zero=True)


@dataclass(kw_only=True, slots=True)
class CriteoConfig:
    """Criteo 1TB / Kaggle TSV files: label, 13 integer and 26 hex categorical columns."""

    train_files: list[str] = field(default_factory=list)
    """TSV files read in order (or torchrec ``*_dense.npy`` files with ``_sparse``/``_labels`` beside)."""
    eval_files: list[str] = field(default_factory=list)
    """Held-out TSV (or ``*_dense.npy``) files for evaluation."""
    cache_dir: str | None = None
    """Where TSV files are converted to npy once (TorchRec's ``tsv_to_npys``); default ``RUN_DIR/criteo_cache``."""


@dataclass(kw_only=True, slots=True)
class DataConfig:
    """Where batches come from and how the global batch is split."""

    source: Literal["synthetic", "criteo"] = "synthetic"
    """``synthetic`` (planted signal) or ``criteo`` (TSV files)."""
    batch_size_per_rank: int = 256
    """Samples per rank per step; the global batch is ``world_size`` times this."""
    seed: int = 0
    """Seed of the synthetic data (the same data for any world or group size)."""
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    """Synthetic data options."""
    criteo: CriteoConfig = field(default_factory=CriteoConfig)
    """Criteo data options."""

    def __post_init__(self) -> None:
        positive(self, "batch_size_per_rank")
        if self.source == "criteo" and not self.criteo.train_files:
            raise bad("criteo.train_files", [], "is empty; data.source=criteo needs TSV files")
        if self.source == "criteo" and not self.criteo.eval_files:
            raise bad("criteo.eval_files", [], "is empty; data.source=criteo needs held-out files")
