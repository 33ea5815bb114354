"""Synthetic and Criteo-format data: determinism, batch split, skew, planted signal, TSV path."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torchmetrics.functional.classification import binary_auroc

from sparse2d.errors import ConfigError
from sparse2d.train.config import load_config
from sparse2d.train.config.data import SyntheticConfig
from sparse2d.train.config.model import TableSpec
from sparse2d.train.data import DataSource
from sparse2d.train.data.criteo import CriteoBatches, CriteoFiles, prepare
from sparse2d.train.data.synthetic import (
    _DENSE,
    _ID,
    _LABEL,
    _LENGTH,
    SyntheticCTR,
    normal,
    uniform,
    zipf_rank,
)

TINY = "configs/tiny_cpu.yaml"


def _global_batch(world: int, step: int, eval_: bool = False) -> dict[str, torch.Tensor]:
    cfg = load_config(TINY, [f"data.batch_size_per_rank={32 // world}"])
    parts = [
        (DataSource(cfg, r, world).eval if eval_ else DataSource(cfg, r, world).train)(step)
        for r in range(world)
    ]
    out = {
        "dense": torch.cat([b.dense_features for b, _ in parts]),
        "labels": torch.cat([b.labels for b, _ in parts]),
        "logits": torch.cat([t for _, t in parts]),
    }
    for key in cfg.model.feature_names:
        out[f"{key}.values"] = torch.cat([b.sparse_features[key].values() for b, _ in parts])
        out[f"{key}.lengths"] = torch.cat([b.sparse_features[key].lengths() for b, _ in parts])
    return out


@pytest.mark.parametrize("eval_", [False, True])
def test_global_batch_is_the_same_for_any_split(eval_: bool) -> None:
    one = _global_batch(1, step=5, eval_=eval_)
    for world in (2, 4):
        split = _global_batch(world, step=5, eval_=eval_)
        for key, value in one.items():
            torch.testing.assert_close(split[key], value, msg=key)


def test_steps_and_streams_differ_and_repeat() -> None:
    a, b = _global_batch(2, 0), _global_batch(2, 1)
    assert not torch.equal(a["dense"], b["dense"])
    assert not torch.equal(a["dense"], _global_batch(2, 0, eval_=True)["dense"])
    torch.testing.assert_close(_global_batch(2, 0)["dense"], a["dense"])


def test_ids_are_skewed_and_in_range() -> None:
    cfg = load_config(TINY, ["data.batch_size_per_rank=20000", "data.synthetic.ids_per_feature=1"])
    batch, _ = DataSource(cfg, 0, 1).train(0)
    ids = batch.sparse_features["t_0"].values().numpy()
    rows = cfg.model.specs()[0].rows
    assert ids.min() >= 0 and ids.max() < rows
    counts = np.sort(np.bincount(ids, minlength=rows))[::-1]
    assert counts[: rows // 100].sum() > 0.3 * len(ids)  # top 1% of rows: > 30% of lookups
    assert (counts > 0).sum() > 500  # yet a long tail is visited


def test_planted_signal_is_learnable_and_known() -> None:
    cfg = load_config(TINY, ["data.batch_size_per_rank=20000"])
    batch, logits = DataSource(cfg, 0, 1).eval(0)
    labels = batch.labels.long()
    planted = float(binary_auroc(torch.sigmoid(logits), labels))
    assert 0.8 < planted < 0.95
    assert 0.15 < float(batch.labels.mean()) < 0.45
    # labels follow the logits: calibration of the planted model within sampling noise
    assert abs(float(torch.sigmoid(logits).mean() - batch.labels.mean())) < 0.02


def _write_tsv(path, rows: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    lines = []
    for _ in range(rows):
        label = str(rng.randint(0, 1))
        ints = ["" if rng.random() < 0.2 else str(rng.randint(-2, 500)) for _ in range(13)]
        cats = ["" if rng.random() < 0.1 else f"{rng.getrandbits(32):08x}" for _ in range(26)]
        lines.append([label, *ints, *cats])
    path.write_text("".join("\t".join(line) + "\n" for line in lines))
    return lines


def test_criteo_tsv_rows_hashing_and_wrap(tmp_path) -> None:
    files = [tmp_path / "day_0.tsv", tmp_path / "day_1.tsv"]
    lines = _write_tsv(files[0], 30, 0) + _write_tsv(files[1], 20, 1)
    cfg = load_config(
        TINY,
        [
            "data.source=criteo",
            "model.tables=[{name: cat, count: 26, rows: 97, dim: 16}]",
            f"data.criteo.train_files=[{files[0]}, {files[1]}]",
            f"data.criteo.eval_files=[{files[1]}]",
        ],
    )
    cache = str(tmp_path / "cache")
    prepare(cfg.data.criteo, cache)
    prepare(cfg.data.criteo, cache)  # cached: no reconversion
    source = CriteoBatches(CriteoFiles(cfg.data.criteo.train_files, cache), cfg.model.specs())
    assert source.files.rows == 50
    batch = source.rows(45, 10)  # rows 45..49 then 0..4: wraps over both files
    index = [45, 46, 47, 48, 49, 0, 1, 2, 3, 4]
    labels = [float(lines[i][0]) for i in index]
    torch.testing.assert_close(batch.labels, torch.tensor(labels))
    for f in (0, 7, 25):
        expect = [int(lines[i][14 + f] or "0", 16) % 97 for i in index]
        torch.testing.assert_close(batch.sparse_features[f"cat_{f}"].values(), torch.tensor(expect))
    # dense: TorchRec's log(x - min + 2) with the per-file minimum; empty fields are 0
    raw0 = np.array([[int(v or "0") for v in line[1:14]] for line in lines[:30]])
    want = np.log(raw0 - raw0.min() + 2).astype(np.float32)
    torch.testing.assert_close(batch.dense_features[5:], torch.from_numpy(want[:5]))


def test_criteo_wrap_around_is_said_up_front(tmp_path) -> None:
    """Files that run out before train.steps (or the eval before eval_batches) are named at
    start with the step they wrap at: a run over 50 rows for 100 steps used to re-read them
    silently and report a train AUC of memorised rows."""
    path = tmp_path / "day_0.tsv"
    _write_tsv(path, 50, 0)
    cfg = _criteo_cfg(tmp_path, path)
    cache = str(tmp_path / "cache")
    prepare(cfg.data.criteo, cache)
    data = DataSource(cfg, 0, 2, cache)  # global batch 2 x 128: one step is past the rows
    train, evals = data.wrap_lines(steps=100, eval_batches=4)
    assert train.startswith(
        f"train files hold 50 rows, {50 / 256:.4g} steps of the global "
        "batch 256: from step 1 on they wrap around (train.steps=100 "
        "reads each row 512 times"
    )
    assert "eval files hold 50 rows, fewer than train.eval_batches=4 x 256" in evals
    big = DataSource(_criteo_cfg(tmp_path, path), 0, 1, cache)
    big.batch_size = big.global_batch = 10  # 5 steps of 10 rows: no wrap at 5, one at 6
    assert big.wrap_lines(steps=5, eval_batches=5) == []
    assert "from step 6 on they wrap" in big.wrap_lines(steps=6, eval_batches=1)[0]
    assert DataSource(load_config(TINY), 0, 1).wrap_lines(10**9, 10**9) == []  # synthetic


# ---- bad Criteo input: bad rows are skipped and counted, unusable files are errors -------
def _criteo_cfg(tmp_path, path) -> object:
    return load_config(
        TINY,
        [
            "data.source=criteo",
            "model.tables=[{name: cat, count: 26, rows: 97, dim: 16}]",
            f"data.criteo.train_files=[{path}]",
            f"data.criteo.eval_files=[{path}]",
            f"run_dir={tmp_path / 'run'}",  # not the checkout's runs/ (check_new_run)
        ],
    )


BAD_ROWS = {
    "column count": (lambda row: row[:-1], "39 columns instead of 40"),
    "categorical": (
        lambda row: [*row[:20], "zz9", *row[21:]],
        "column 20 value 'zz9' is not hexadecimal",
    ),
    "integer": (lambda row: [row[0], "1.5", *row[2:]], "column 1 value '1.5' is not an integer"),
    "label": (lambda row: ["2", *row[1:]], "label '2' is not 0 or 1"),
}


@pytest.mark.parametrize("kind", sorted(BAD_ROWS))
def test_criteo_bad_rows_are_skipped_counted_and_named(tmp_path, kind: str) -> None:
    path = tmp_path / "day_0.tsv"
    lines = _write_tsv(path, 12, 3)
    breaks, detail = BAD_ROWS[kind]
    lines[4] = breaks(lines[4])
    path.write_text("".join("\t".join(line) + "\n" for line in lines))
    cfg = _criteo_cfg(tmp_path, path)
    cfg.check_runtime(world_size=2)  # a file with a few bad rows passes the config check
    cache = str(tmp_path / "cache")
    report = prepare(cfg.data.criteo, cache)
    assert report == [f"{path}: skipped 1 of 12 rows: 1 {kind} (line 5: {detail})"]
    assert prepare(cfg.data.criteo, cache) == report  # cached, still reported
    files = CriteoFiles(cfg.data.criteo.train_files, cache)
    assert files.rows == 11
    good = [lines[i] for i in range(12) if i != 4]
    labels = CriteoBatches(files, cfg.model.specs()).rows(0, 11).labels
    torch.testing.assert_close(labels, torch.tensor([float(line[0]) for line in good]))


def test_criteo_file_without_usable_rows_is_an_error(tmp_path) -> None:
    path = tmp_path / "day_0.tsv"
    path.write_text("not\ta\tcriteo\trow\n" * 3)
    with pytest.raises(ConfigError, match=r"has no usable rows .*3 column count \(line 1: 4 col"):
        prepare(_criteo_cfg(tmp_path, path).data.criteo, str(tmp_path / "cache"))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p.write_text(""), "is empty; give a Criteo TSV"),
        (lambda p: p.mkdir(), "is a directory; list the data files themselves"),
    ],
)
def test_criteo_unusable_path_fails_the_config_check(tmp_path, make, message: str) -> None:
    path = tmp_path / "day_0.tsv"
    make(path)
    with pytest.raises(ConfigError, match=r"data\.criteo\.train_files\[0\]=.*" + message):
        _criteo_cfg(tmp_path, path).check_runtime(world_size=2)


def test_criteo_empty_npy_triplet_is_an_error(tmp_path) -> None:
    stem = tmp_path / "day_0"
    np.save(f"{stem}_dense.npy", np.zeros((0, 13), dtype=np.float32))
    np.save(f"{stem}_sparse.npy", np.zeros((0, 26), dtype=np.int64))
    np.save(f"{stem}_labels.npy", np.zeros((0, 1), dtype=np.int32))
    with pytest.raises(ConfigError, match="holds no rows; give a non-empty file"):
        CriteoFiles([f"{stem}_dense.npy"], str(tmp_path))


def _per_feature(gen: SyntheticCTR, stream: int, start: int, count: int) -> dict[str, np.ndarray]:
    """The generator's definition written feature by feature (the module's docstring), from
    its keyed hashes: the reference its one-pass implementation must equal bit for bit."""
    idx = np.arange(start, start + count, dtype=np.uint64)[:, None]
    key, k = (gen.seed, stream), gen.cfg.ids_per_feature
    dense = normal(*key, idx, _DENSE + np.arange(gen.dense_in, dtype=np.uint64))
    logit = gen.cfg.bias + dense @ gen.coef
    lengths, values = [], []
    for f, (_, t, spec) in enumerate(gen.features):
        length = 1 + np.floor(uniform(*key, idx[:, 0], _LENGTH + np.uint64(f)) * k).astype(int)
        u = uniform(*key, idx, _ID + np.uint64(f * 4096) + np.arange(k, dtype=np.uint64))
        rank = zipf_rank(u, spec.rows, gen.cfg.zipf_exponent)
        mask = np.arange(k)[None, :] < length[:, None]
        effect = np.zeros_like(u)
        hot = rank < len(gen.effects[t])
        effect[hot] = gen.effects[t][rank[hot]]
        pooled = (effect * mask).sum(1)
        logit = logit + (pooled / length if spec.pooling == "mean" else pooled)
        a, b = gen.scramble[t]
        lengths.append(length)
        values.append(((rank * a + b) % spec.rows)[mask])
    labels = uniform(*key, idx[:, 0], _LABEL) < 1.0 / (1.0 + np.exp(-logit))
    return {
        "dense": dense.astype(np.float32),
        "logit": logit.astype(np.float32),
        "labels": labels.astype(np.float32),
        "values": np.concatenate(values),
        "lengths": np.concatenate(lengths).astype(np.int32),
    }


@pytest.mark.parametrize("ids", [1, 3, 12])
@pytest.mark.parametrize("exponent", [1.0, 1.1, 0.7])
def test_one_pass_batch_equals_the_per_feature_definition(ids: int, exponent: float) -> None:
    """All features are drawn in one pass of array ops (a batch costs a few dozen of them,
    not that many per feature); every value equals the per-feature definition exactly:
    mixed pooling, a table smaller than ``signal_rows``, a 1-row table, two features on one."""
    tables = [
        TableSpec("a", 3, 8, ["a"], "sum", None),
        TableSpec("b", 100, 8, ["b0", "b1"], "mean", None),
        TableSpec("c", 2000, 8, ["c"], "sum", None),
        TableSpec("d", 1, 8, ["d"], "mean", None),
    ]
    cfg = SyntheticConfig(zipf_exponent=exponent, ids_per_feature=ids, signal_rows=32)
    gen = SyntheticCTR(tables, 13, cfg, seed=7)
    for stream, start, count in [(0, 0, 64), (1, 12345, 7), (0, 10**9, 33)]:
        batch, logit = gen.samples(stream, start, count)
        want = _per_feature(gen, stream, start, count)
        got = {
            "dense": batch.dense_features,
            "logit": logit,
            "labels": batch.labels,
            "values": batch.sparse_features.values(),
            "lengths": batch.sparse_features.lengths(),
        }
        for name, value in got.items():
            assert value.numpy().dtype == want[name].dtype, name
            assert np.array_equal(value.numpy(), want[name]), (name, stream, start)
        assert batch.sparse_features.keys() == ["a", "b0", "b1", "c", "d"]
