"""Synthetic CTR data with a planted signal, a pure function of (seed, stream, sample index).

Every value of sample ``i`` comes from a counter-based hash of ``(seed, stream, i, field)``
(SplitMix64), so the global batch of a step is the same whatever the world size or the
sharding-group size: 1D and 2D runs see identical data, and resuming needs only the step.

The planted model (known, so the best achievable AUC is known):

    logit = bias + sum_j c_j * x_j  (j < dense_signal)
                 + sum_f pool_{id in bag_f} e_t(rank(id))   (rank < signal_rows)

``x`` ~ N(0, 1); ids are Zipf-like over each table's rows (rank ``r`` drawn with
P(r) ~ (r+1)^-s, then scrambled to a row by a fixed bijection so hot rows are spread);
only the ``signal_rows`` hottest rows of each table carry an effect ``e ~ N(0, w^2)``;
pooling follows the table (sum or mean). Labels are Bernoulli(sigmoid(logit)).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from sparse2d.train.config.data import SyntheticConfig
from sparse2d.train.config.model import TableSpec

TRAIN, EVAL = 0, 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_DENSE, _LENGTH, _ID, _LABEL, _EFFECT, _COEF = (np.uint64(k << 40) for k in range(1, 7))


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finalizer (uint64, wrapping)."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _hash(*parts: np.ndarray | int) -> np.ndarray:
    with np.errstate(over="ignore"):
        h = np.uint64(0)
        for part in parts:
            h = _mix(h * _GOLDEN + np.asarray(part, dtype=np.uint64))
    return h


def uniform(*parts: np.ndarray | int) -> np.ndarray:
    """Uniform [0, 1) doubles keyed by ``parts`` (broadcast)."""
    return (_hash(*parts) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def normal(*parts: np.ndarray | int) -> np.ndarray:
    """Standard normals keyed by ``parts`` (Box-Muller on two keyed uniforms)."""
    u1 = 1.0 - uniform(*parts, 1)
    u2 = uniform(*parts, 2)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)


def zipf_rank(u: np.ndarray, rows: int, exponent: float) -> np.ndarray:
    """Inverse CDF of a continuous Zipf(exponent) over ranks ``0..rows-1``."""
    return _inverse_zipf(u, *_zipf_constants(rows, exponent), rows)


def _zipf_constants(rows: int, exponent: float) -> tuple[float, float | None]:
    """The inverse CDF's constants, in Python floats: ``(log(rows + 1), None)`` at exponent
    1, else ``((rows + 1)^a - 1, 1 / a)`` with ``a = 1 - exponent``."""
    if abs(exponent - 1.0) < 1e-9:
        return math.log(rows + 1.0), None
    a = 1.0 - exponent
    return (rows + 1.0) ** a - 1.0, 1.0 / a


def _inverse_zipf(
    u: np.ndarray, scale: float | np.ndarray, power: float | None, rows: int | np.ndarray
) -> np.ndarray:
    """``zipf_rank`` from its constants (scalars, or columns broadcast over features)."""
    x = np.exp(u * scale) if power is None else (scale * u + 1.0) ** power
    return np.clip(np.floor(x).astype(np.int64) - 1, 0, rows - 1)


def _coprime_multiplier(rows: int, salt: int) -> int:
    if rows <= 2:
        return 1
    a = (0x9E3779B1 + 7919 * salt) % rows or 1
    while math.gcd(a, rows) != 1:
        a = a % (rows - 1) + 1
    return a


class SyntheticCTR:
    """Generates samples ``start .. start+count-1`` of a stream, with their true logits."""

    def __init__(
        self, tables: list[TableSpec], dense_in: int, cfg: SyntheticConfig, seed: int
    ) -> None:
        self.cfg, self.seed, self.dense_in = cfg, seed, dense_in
        self.features: list[tuple[str, int, TableSpec]] = [
            (name, t, spec) for t, spec in enumerate(tables) for name in spec.features
        ]
        self.keys = [name for name, _, _ in self.features]
        self.scramble = [
            (_coprime_multiplier(s.rows, t), int(_hash(seed, t) % np.uint64(s.rows)))
            for t, s in enumerate(tables)
        ]
        self.effects = [
            normal(seed, _EFFECT, t, np.arange(min(cfg.signal_rows, s.rows))) * cfg.sparse_weight
            for t, s in enumerate(tables)
        ]
        coef = normal(seed, _COEF, np.arange(dense_in)) * cfg.dense_weight
        coef[min(cfg.dense_signal, dense_in) :] = 0.0
        self.coef = coef
        self._by_feature = _FeatureArrays(self.features, self.scramble, self.effects, cfg)

    def samples(self, stream: int, start: int, count: int) -> tuple[Batch, torch.Tensor]:
        """Every feature at once: one pass of array ops over (sample, feature, slot), the
        same keyed values as feature by feature (bit for bit: ``tests/test_data.py``)."""
        idx = np.arange(start, start + count, dtype=np.uint64)[:, None]
        key = (self.seed, stream)
        dense = normal(*key, idx, _DENSE + np.arange(self.dense_in, dtype=np.uint64))
        logit = self.cfg.bias + dense @ self.coef
        f = self._by_feature
        k = self.cfg.ids_per_feature
        length = 1 + np.floor(uniform(*key, idx, _LENGTH + f.index) * k).astype(np.int64)
        u = uniform(*key, idx[:, :, None], f.id_keys)  # (sample, feature, slot)
        rank = f.zipf_rank(u)
        mask = f.slots < length[:, :, None]
        hot = rank < f.signal_rows
        effect = np.where(
            hot, f.effects[f.effect_offset + np.minimum(rank, f.signal_rows - 1)], 0.0
        )
        pooled = (effect * mask).sum(2)
        for j, mean in enumerate(f.mean):  # feature by feature: the same rounding as before
            logit = logit + (pooled[:, j] / length[:, j] if mean else pooled[:, j])
        rows = (rank * f.scramble_a + f.scramble_b) % f.rows
        labels = uniform(*key, idx[:, 0], _LABEL) < 1.0 / (1.0 + np.exp(-logit))
        kjt = KeyedJaggedTensor(  # feature-major, as TorchRec lays out a KJT
            keys=self.keys,
            values=torch.from_numpy(rows.transpose(1, 0, 2)[mask.transpose(1, 0, 2)]),
            lengths=torch.from_numpy(length.T.reshape(-1).astype(np.int32)),
        )
        batch = Batch(
            dense_features=torch.from_numpy(dense.astype(np.float32)),
            sparse_features=kjt,
            labels=torch.from_numpy(labels.astype(np.float32)),
        )
        return batch, torch.from_numpy(logit.astype(np.float32))


class _FeatureArrays:
    """Per-feature constants of ``SyntheticCTR`` as arrays shaped (feature, 1) to broadcast
    over (sample, feature, slot): a batch then costs a few dozen array ops, not that many
    per feature. The Zipf CDF's constants are ``zipf_rank``'s own, in Python floats, so every
    rounding is the one a single feature gets."""

    def __init__(
        self,
        features: list[tuple[str, int, TableSpec]],
        scramble: list[tuple[int, int]],
        effects: list[np.ndarray],
        cfg: SyntheticConfig,
    ) -> None:
        def column(values: list, dtype: type) -> np.ndarray:
            return np.array(values, dtype=dtype)[:, None]

        k, exponent = cfg.ids_per_feature, cfg.zipf_exponent
        n = len(features)
        self.index = np.arange(n, dtype=np.uint64)
        self.id_keys = _ID + (self.index * np.uint64(4096))[:, None] + np.arange(k, dtype=np.uint64)
        self.slots = np.arange(k)
        self.rows = column([spec.rows for _, _, spec in features], np.int64)
        self.mean = [spec.pooling == "mean" for _, _, spec in features]
        self.scramble_a = column([scramble[t][0] for _, t, _ in features], np.int64)
        self.scramble_b = column([scramble[t][1] for _, t, _ in features], np.int64)
        sizes = [len(e) for e in effects]
        offsets = np.cumsum([0, *sizes[:-1]]) if effects else np.zeros(0, dtype=np.int64)
        self.effects = np.concatenate([*effects, np.zeros(1)])  # a spare slot: no table empty
        self.effect_offset = column([int(offsets[t]) for _, t, _ in features], np.int64)
        self.signal_rows = column([sizes[t] for _, t, _ in features], np.int64)
        constants = [_zipf_constants(spec.rows, exponent) for _, _, spec in features]
        self.zipf_scale = column([scale for scale, _ in constants], np.float64)
        self.zipf_power = _zipf_constants(1, exponent)[1]  # the same for every table

    def zipf_rank(self, u: np.ndarray) -> np.ndarray:
        """``zipf_rank`` of every feature's table at once."""
        return _inverse_zipf(u, self.zipf_scale, self.zipf_power, self.rows)
