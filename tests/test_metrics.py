"""Train-window metrics equal the exact ones computed on all predictions at once."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchmetrics.functional.classification import binary_auroc

from sparse2d.train.metrics import TrainWindow, ne_from_sums


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
