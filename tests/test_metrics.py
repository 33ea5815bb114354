"""Train-window metrics equal the exact ones computed on all predictions at once."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torchmetrics.functional.classification import binary_auroc
from torchrec.metrics.ne import compute_ne

from sparse2d.train.metrics import TrainWindow, exact_auc, ne_from_sums


def test_window_matches_exact_metrics() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4000, generator=gen) * 2
    labels = (torch.rand(4000, generator=gen) < torch.sigmoid(logits)).float()
    window = TrainWindow()
    for part in range(4):  # four "steps" of 1000
        window.update(
            logits[part * 1000 : (part + 1) * 1000], labels[part * 1000 : (part + 1) * 1000]
        )
    out = window.reduce()
    ce = F.binary_cross_entropy_with_logits(logits, labels, reduction="sum")
    torch.testing.assert_close(out["train_loss"], float(ce) / 4000, rtol=1e-6, atol=0)  # fp32 sums
    assert abs(out["train_ne"] - ne_from_sums(float(ce), 4000, float(labels.sum()))) < 1e-6
    exact_auc = float(binary_auroc(torch.sigmoid(logits), labels.long()))
    assert abs(out["train_auc"] - exact_auc) < 2e-3, (out["train_auc"], exact_auc)  # 1024 bins
    assert window.reduce() == {}  # reduce starts a new, empty window


@pytest.mark.parametrize("n,levels", [(2, 0), (7, 3), (1000, 0), (5000, 20), (20000, 1000)])
def test_exact_auc_equals_torchmetrics(n: int, levels: int) -> None:
    """Ties (scores rounded to ``levels`` values; 0: continuous) count half, as in the ROC."""
    gen = torch.Generator().manual_seed(n + levels)
    logits = torch.randn(n, generator=gen) * 2
    labels = (torch.rand(n, generator=gen) < torch.sigmoid(logits)).float()
    labels[:2] = torch.tensor([0.0, 1.0])  # both classes present
    scores = torch.sigmoid(logits)
    if levels:
        scores = torch.round(scores * levels) / levels
    expected = float(binary_auroc(scores, labels.long()))
    assert math.isclose(exact_auc(scores, labels), expected, abs_tol=1e-6)


def test_exact_auc_of_one_class_follows_torchmetrics() -> None:
    scores = torch.rand(10)
    for label, missing in ((0.0, "positive"), (1.0, "negative")):
        labels = torch.full((10,), label)
        with pytest.warns(UserWarning, match=f"No {missing} samples"):  # torchmetrics says so
            assert exact_auc(scores, labels) == float(binary_auroc(scores, labels.long()))


@pytest.mark.parametrize(
    "ce,count,positives",
    [
        (700.0, 1000.0, 250.0),
        (3.2, 10.0, 1.0),
        (5.0, 10.0, 0.0),
        (5.0, 10.0, 10.0),
        (0.0, 0.0, 0.0),
        (123456.7, 4e6, 1.0e6),
    ],
)
def test_ne_equals_torchrec_compute_ne(ce: float, count: float, positives: float) -> None:
    t = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    expected = float(
        compute_ne(t(ce / math.log(2.0)), t(count), t(positives), t(count - positives), 1e-12)
    )
    got = ne_from_sums(ce, count, positives)
    assert (math.isnan(got) and math.isnan(expected)) or math.isclose(got, expected, rel_tol=1e-12)
