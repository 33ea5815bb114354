"""Data sources: each rank reads its own contiguous slice of every global batch.

At step ``s`` the global batch is samples ``[s*G, (s+1)*G)`` (``G = world_size x B``) and rank
``r`` reads ``[s*G + r*B, s*G + (r+1)*B)``, so the data a 1D and a 2D run see depends only on
the step. Evaluation reads ``eval_batches`` global batches of a held-out stream or files,
split the same way.
"""

from __future__ import annotations

import torch
from torchrec.datasets.utils import Batch

from sparse2d.train.config import Config
from sparse2d.train.data.synthetic import EVAL, TRAIN, SyntheticCTR

__all__ = ["DataSource", "SyntheticCTR"]


class DataSource:
    """``train(step)`` / ``eval(i)`` give this rank's ``(batch, true_logits or None)``."""

    def __init__(self, cfg: Config, rank: int, world_size: int, cache_dir: str = "") -> None:
        self.batch_size = cfg.data.batch_size_per_rank
        self.global_batch = self.batch_size * world_size
        self.rank = rank
        tables = cfg.model.data_specs()
        self.synthetic: SyntheticCTR | None = None
        if cfg.data.source == "synthetic":
            self.synthetic = SyntheticCTR(
                tables, cfg.model.dense_in_features, cfg.data.synthetic, cfg.data.seed
            )
        else:  # here, not at the top: only a Criteo run loads the TSV reader
            from sparse2d.train.data.criteo import CriteoBatches, CriteoFiles

            self._train = CriteoBatches(CriteoFiles(cfg.data.criteo.train_files, cache_dir), tables)
            self._eval = CriteoBatches(CriteoFiles(cfg.data.criteo.eval_files, cache_dir), tables)

    def wrap_lines(self, steps: int, eval_batches: int) -> list[str]:
        """Lines saying where the files run out and the rows come round again (Criteo: step
        ``s`` reads rows ``[s*G, (s+1)*G)`` modulo the rows there); none for synthetic data,
        which is endless. Repeated rows are memorised: on a few rows the train AUC climbs
        whatever the labels mean."""
        if self.synthetic is not None:
            return []
        lines = []
        rows, need = self._train.files.rows, steps * self.global_batch
        if need > rows:
            lines.append(
                f"train files hold {rows} rows, {rows / self.global_batch:.4g} steps of the "
                f"global batch {self.global_batch}: from step {rows // self.global_batch + 1} "
                f"on they wrap around (train.steps={steps} reads each row {need / rows:.3g} "
                "times; train metrics then count memorised rows): give more rows "
                "(data.criteo.train_files) or fewer steps"
            )
        rows, need = self._eval.files.rows, eval_batches * self.global_batch
        if need > rows:
            lines.append(
                f"eval files hold {rows} rows, fewer than train.eval_batches={eval_batches} x "
                f"{self.global_batch}: the eval wraps around and counts rows {need / rows:.3g} times"
            )
        return lines

    def start(self, step: int) -> int:
        """Index of this rank's first sample at ``step``."""
        return step * self.global_batch + self.rank * self.batch_size

    def train(self, step: int) -> tuple[Batch, torch.Tensor | None]:
        return self._get(TRAIN, step)

    def eval(self, index: int) -> tuple[Batch, torch.Tensor | None]:
        return self._get(EVAL, index)

    def _get(self, stream: int, step: int) -> tuple[Batch, torch.Tensor | None]:
        start = self.start(step)
        if self.synthetic is not None:
            return self.synthetic.samples(stream, start, self.batch_size)
        source = self._train if stream == TRAIN else self._eval
        return source.rows(start, self.batch_size), None
