"""Loss, AUC and normalized entropy (NE), identical on every rank.

Evaluation gathers every rank's logits and labels for the exact AUC and NE (TorchRec's
``compute_ne`` formula); written here because importing ``torchrec.metrics`` cost every trainer
0.9 CPU-seconds at start-up (``tests/test_metrics.py`` holds them equal to torchmetrics' and
TorchRec's). The training window is reduced instead: sums for loss/NE and a 1024-bin score
histogram for the AUC. NE 1.0 = no better than predicting the CTR.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from sparse2d.comm_device import flag_device

BINS = 1024
_ETA = 1e-12


def ne_from_sums(ce_sum: float, count: float, positives: float) -> float:
    """NE from the summed natural-log loss, sample count and positive count: TorchRec's
    ``compute_ne`` (base rate clamped to [eta, 1 - eta], count to >= eta)."""
    mean = min(max(positives / max(count, _ETA), _ETA), 1.0 - _ETA)
    norm = -positives * math.log(mean) - (count - positives) * math.log(1.0 - mean)
    if norm == 0:  # no samples: TorchRec's tensor division gives nan (0/0) or inf
        return float("nan") if ce_sum == 0 else math.copysign(math.inf, ce_sum)
    return ce_sum / norm


def exact_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve: P(score_pos > score_neg) + 0.5 P(equal) over every
    (positive, negative) pair, by the rank-sum statistic with ties given their mean rank."""
    scores, positive = scores.flatten(), labels.flatten() > 0.5
    n_pos = int(positive.sum())
    n_neg = scores.numel() - n_pos
    if n_pos == 0 or n_neg == 0:  # undefined; keep torchmetrics' convention for it
        # here, not at the top: torchmetrics takes a second to import, for this corner alone
        from torchmetrics.functional.classification import binary_auroc

        return float(binary_auroc(scores, labels.long()))
    order = torch.argsort(scores)
    _, inverse, counts = torch.unique_consecutive(
        scores[order], return_inverse=True, return_counts=True
    )
    ends = torch.cumsum(counts, 0).double()
    mean_rank = (ends - counts.double() + 1 + ends) / 2  # 1-based ranks of each tie run
    rank_sum = float(mean_rank[inverse][positive[order]].sum())
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def _all_gather(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Every rank's ``x`` (a CPU tensor), concatenated on the CPU; through the GPU where the
    group runs NCCL alone (``flag_device``)."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return x
    x = x.to(flag_device(group)).contiguous()
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x, group=group)
    return torch.cat(parts).cpu()


def eval_metrics(
    logits: torch.Tensor, labels: torch.Tensor, true_logits: torch.Tensor | None = None
) -> dict[str, float]:
    """Exact metrics over every rank's eval predictions (collective: call on all ranks)."""
    logits, labels = _all_gather(logits.float().cpu()), _all_gather(labels.float().cpu())
    ce = F.binary_cross_entropy_with_logits(logits, labels, reduction="sum")
    out = {
        "eval_loss": float(ce) / len(labels),
        "eval_auc": exact_auc(torch.sigmoid(logits), labels),
        "eval_ne": ne_from_sums(float(ce), len(labels), float(labels.sum())),
        "eval_samples": len(labels),
        "eval_ctr": float(labels.mean()),
    }
    if true_logits is not None:
        true_logits = _all_gather(true_logits.float().cpu())
        out["planted_auc"] = exact_auc(torch.sigmoid(true_logits), labels)
        planted_ce = F.binary_cross_entropy_with_logits(true_logits, labels, reduction="sum")
        out["planted_ne"] = ne_from_sums(float(planted_ce), len(labels), float(labels.sum()))
    return out


def auc_from_histograms(pos: torch.Tensor, neg: torch.Tensor) -> float:
    """AUC of binned scores: P(score_pos > score_neg) + 0.5 P(same bin)."""
    pos, neg = pos.double(), neg.double()
    if pos.sum() == 0 or neg.sum() == 0:
        return float("nan")
    below = torch.cumsum(neg, 0) - neg
    return float(((pos * (below + 0.5 * neg)).sum()) / (pos.sum() * neg.sum()))


class TrainWindow:
    """Accumulates train predictions between logs; ``reduce()`` is a collective.

    ``update`` runs every step, so it stays on the predictions' device with static shapes
    and never reads a value back to the host (no per-step device synchronization); the
    host sees the sums once per window, in ``reduce``.
    """

    def __init__(self) -> None:
        self.sums: torch.Tensor | None = None  # ce, count, positives
        self.hist: torch.Tensor | None = None  # [positives' bins, negatives' bins]

    def reset(self) -> None:
        self.sums = self.hist = None

    @torch.no_grad()
    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        logits, labels = logits.detach().float(), labels.detach().float()
        ce = F.binary_cross_entropy_with_logits(logits, labels, reduction="sum")
        sums = torch.stack(
            [ce, torch.tensor(float(labels.numel()), device=ce.device), labels.sum()]
        )
        bins = (torch.sigmoid(logits) * BINS).long().clamp_(0, BINS - 1)
        bins += (labels <= 0.5).long() * BINS  # negatives in the second half: one bincount
        hist = torch.bincount(bins, minlength=2 * BINS)
        if self.sums is None or self.hist is None:
            self.sums, self.hist = sums.double(), hist.double()
        else:
            self.sums += sums
            self.hist += hist

    def reduce(self) -> dict[str, float]:
        if self.sums is None or self.hist is None:
            flat = torch.zeros(3 + 2 * BINS, dtype=torch.float64)
        else:
            flat = torch.cat([self.sums, self.hist]).cpu()
        if dist.is_initialized():
            flat = flat.to(flag_device())
            dist.all_reduce(flat)
            flat = flat.cpu()
        ce, count, positives = flat[:3].tolist()
        hist = flat[3:].reshape(2, BINS)
        self.reset()
        if count == 0:
            return {}
        return {
            "train_loss": ce / count,
            "train_auc": auc_from_histograms(hist[0], hist[1]),
            "train_ne": ne_from_sums(ce, count, positives),
        }


@torch.no_grad()
def evaluate_batches(
    model: torch.nn.Module, data: Any, batches: int, device: torch.device
) -> dict[str, float]:
    """Eval forward over ``batches`` of ``data.eval(i)`` (the model in eval mode meanwhile),
    then :func:`eval_metrics` over every rank's predictions (collective)."""
    logits, labels, truth = [], [], []
    model.eval()
    try:
        for i in range(batches):
            batch, true_logits = data.eval(i)
            _, (_, out, label) = model(batch.to(device))
            logits.append(out.float().cpu())
            labels.append(label.float().cpu())
            if true_logits is not None:
                truth.append(true_logits)
    finally:
        model.train()
    return eval_metrics(torch.cat(logits), torch.cat(labels), torch.cat(truth) if truth else None)


def max_over_ranks(values: list[float]) -> list[float]:
    """Each value's maximum over this world's ranks (collective)."""
    t = torch.tensor(values, dtype=torch.float64, device=flag_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()
