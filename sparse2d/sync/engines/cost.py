"""What a replica sync costs: constants measured over the replica group, and the model.

A sync's time is modelled as ``collectives x latency + wire bytes x seconds-per-byte + copy
bytes x copy cost + stamp-scan rows x scan cost`` (one copy cost for contiguous, one for
indexed copies). ``probe`` measures the constants at start-up and takes the MAX over the
replica group, so every replica decides from the same numbers: a replica that picked another
engine would issue other collectives and hang the group.
"""

from __future__ import annotations

import time
from dataclasses import astuple, dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True, slots=True)
class LinkCosts:
    """Cost constants of one replica group (identical on its ranks after ``probe``)."""

    latency_s: float
    """Fixed time of one collective on the replica group (tiny all-reduce)."""
    wire_s_per_byte: float
    """All-reduce time per payload byte beyond the latency."""
    copy_s_per_byte: float
    """Contiguous gather + scatter (copy into the buffer and back) per byte."""
    index_s_per_byte: float
    """Indexed gather + scatter (``index_select`` + ``index_copy_`` of rows) per byte."""
    scan_s_per_row: float
    """Scanning one row's touched stamp (count or ``nonzero``)."""

    def dense_s(self, nbytes: float, collectives: int = 1) -> float:
        """A sync moving ``nbytes`` of whole shards."""
        return collectives * self.latency_s + nbytes * (self.wire_s_per_byte + self.copy_s_per_byte)

    def rows_s(self, nbytes: float) -> float:
        """Moving ``nbytes`` of selected rows (no latency: they share the payload collective)."""
        return nbytes * (self.wire_s_per_byte + self.index_s_per_byte)

    def crossover(self) -> float:
        """Union fraction above which a shard is cheaper synced whole than row by row."""
        whole = self.wire_s_per_byte + self.copy_s_per_byte
        rows = self.wire_s_per_byte + self.index_s_per_byte
        return min(1.0, max(0.05, whole / rows)) if rows > 0 else 1.0


def _median_s(fn: object, reps: int) -> float:
    times = []
    for _ in range(reps):
        begin = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - begin)
    return sorted(times)[len(times) // 2]


def probe(
    pg: dist.ProcessGroup, device: torch.device, probe_bytes: int = 1 << 20, reps: int = 5
) -> LinkCosts:
    """Measure ``LinkCosts`` over ``pg`` (collective on ``pg``; a few ms); same on all ranks.

    The wire and latency numbers come from all-reduces of 1 fp32 element and of
    ``probe_bytes``; the copy numbers from local copies of that size; the MAX over ranks
    is taken so that the slowest replica (the one a sync waits for) sets them.
    """
    n = probe_bytes // 4
    tiny = torch.zeros(1, device=device)
    big = torch.zeros(n, device=device)

    def reduce(t: torch.Tensor) -> None:
        dist.all_reduce(t, group=pg)

    reduce(tiny)  # warm the connection
    latency = _median_s(lambda: reduce(tiny), reps)
    wire = max(_median_s(lambda: reduce(big), max(3, reps // 2)) - latency, 0.0) / probe_bytes
    cols = 16
    src = torch.randn(n // cols, cols, device=device)
    dst = torch.empty_like(src)
    rows = torch.randperm(src.shape[0], device=device)[: src.shape[0] // 2].sort().values
    part = torch.empty(rows.numel(), cols, device=device)
    copy = _median_s(lambda: (dst.copy_(src), src.copy_(dst)), reps) / probe_bytes

    def indexed() -> None:
        torch.index_select(src, 0, rows, out=part)
        dst.index_copy_(0, rows, part)

    index = _median_s(indexed, reps) / (part.numel() * 4)
    stamps = torch.zeros(n, dtype=torch.int32, device=device)
    scan = _median_s(lambda: torch.nonzero(stamps > 0), reps) / n
    local = LinkCosts(latency, wire, copy, index, scan)
    agreed = torch.tensor(astuple(local), dtype=torch.float64, device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=pg)
    return LinkCosts(*(float(x) for x in agreed.tolist()))
