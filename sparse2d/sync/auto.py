"""``engine="auto"``: per sync, the cheaper of a dense and a touched-rows sync, by cost.

The touched-rows engine pays fixed costs a dense sync does not: one all-gather
of per-shard counts and usually one union exchange before the payload
all-reduce, plus a scan of the row stamps and indexed copies. On small shards
those collectives cost more than the bytes they save (the main job: 14.4 ms vs
6.9 ms per sync); on large, sparsely touched shards they save 60x. So each
sync predicts both with ``LinkCosts`` (measured at start-up) and the expected
union per shard, and runs the cheaper.

Every input of the decision is identical on all replicas, so all take the same
branch (no mismatched collectives):

* the constants are MAX-reduced over the replica group at start-up;
* union sizes come from the last touched-rows sync (agreed by construction) or,
  in dense mode, from the local touched counts riding at the end of the dense
  fp32 all-reduce (their average is the same on every replica; union is
  estimated as replicas x mean count x the overlap seen in the last sparse sync);
* online refinement: each replica also sends its measured time of the previous
  sync (int microseconds along with the sparse counts; seconds and squared
  seconds in the dense tail, whose averages give the fastest replica's time).
  The fastest replica arrived last and did not wait for the others, so its time
  is the sync's own cost. The touched-rows mode also sends the time of its
  metadata all-gather alone, which refines the per-collective latency (on a
  busy host far above the idle-loop probe); the rest of the difference refines
  one scale on the byte, copy and scan terms (both EMAs).

A switch needs the other mode to be predicted ``HYSTERESIS`` cheaper (noise near
the break-even point would otherwise flip it every sync). Values are the same as
the dense engine's to the bit: only which rows travel changes.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from sparse2d.sync.cost import LinkCosts, probe
from sparse2d.sync.engine import Payload
from sparse2d.sync.sparse import (
    STATES,
    WEIGHTS,
    SparseEngine,
    SparseStats,
    _build_payload,
    _row_bytes,
)
from sparse2d.sync.tensors import ShardState, flush_caches

DENSE, SPARSE = "dense", "sparse"
HYSTERESIS = 0.9
"""Switch modes only when the other one is predicted below this fraction of the current."""
EMA = 0.3
"""Weight of the newest observation in the refined latency and scale."""
SCALE_RANGE = (0.2, 20.0)
"""Bounds of one observation of the scale (a stall must not swamp the model)."""


class AutoEngine(SparseEngine):
    """Per sync, dense or touched-rows sync (with per-shard dense fallback), by modelled cost."""

    def __init__(
        self,
        shards: list[ShardState],
        replica_pg: dist.ProcessGroup,
        *,
        costs: LinkCosts | None = None,
    ) -> None:
        if costs is None:
            device = shards[0].weight.device if shards else torch.device("cpu")
            costs = (
                probe(replica_pg, device)
                if dist.get_world_size(replica_pg) > 1
                else LinkCosts(0.0, 0.0, 0.0, 0.0, 0.0)
            )
        super().__init__(shards, replica_pg, crossover=costs.crossover())
        self.costs = costs
        self.mode = SPARSE
        """Mode of the latest ``payload``."""
        self.counts = {DENSE: 0, SPARSE: 0}
        """Payloads built per mode."""
        self.latency_s = costs.latency_s
        """Per-collective latency, refined online from timed metadata all-gathers."""
        self.scale = 1.0
        """Measured / modelled time of everything but the latency, refined online."""
        self._gather_s = -1.0  # this rank's time of the last metadata all-gather
        self._union: dict[tuple[int, str], float] = {}
        self._overlap = 1.0  # union / sum of replicas' counts, from the last sparse sync
        self._modelled: dict[str, tuple[int, float] | None] = {DENSE: None, SPARSE: None}
        self._measured = {DENSE: -1.0, SPARSE: -1.0}  # this rank's time of that sync
        self._began: float | None = None

    # ---- the model ----------------------------------------------------------------------
    def _entries(self, kinds: list[str]) -> list[tuple[int, str, int, int]]:
        """(shard, kind, rows, bytes per row) of every selection."""
        out = []
        for i, shard in enumerate(self.shards):
            for kind, tensors in self._kinds(shard, WEIGHTS in kinds, STATES in kinds):
                out.append((i, kind, shard.rows, sum(_row_bytes(t) for t in tensors)))
        return out

    def _has_fp32(self, kinds: list[str]) -> bool:
        """Whether the payload of ``kinds`` has an fp32 buffer to carry the dense-mode tail."""
        return any(
            t.dtype == torch.float32
            for shard in self.shards
            for _, tensors in self._kinds(shard, WEIGHTS in kinds, STATES in kinds)
            for t in tensors
        )

    def _buffers(self, kinds: list[str]) -> int:
        dtypes = set()
        for shard in self.shards:
            for _, tensors in self._kinds(shard, WEIGHTS in kinds, STATES in kinds):
                dtypes.update(t.dtype for t in tensors)
        return max(1, len(dtypes))

    def model(self, kinds: list[str]) -> dict[str, tuple[int, float] | None]:
        """Per mode: (collectives, seconds besides their latency); None = union not known yet."""
        c, entries = self.costs, self._entries(kinds)
        scan = sum(rows for _, _, rows, _ in entries) * c.scan_s_per_row
        buffers = self._buffers(kinds)
        dense = (buffers, c.dense_s(sum(r * b for _, _, r, b in entries), 0) + scan)
        rest, unions = scan, False
        for i, kind, rows, row_bytes in entries:
            union = self._union.get((i, kind))
            if union is None:
                return {DENSE: dense, SPARSE: None}
            whole = c.dense_s(rows * row_bytes, 0)
            if union <= self.crossover * rows:
                rest += min(c.rows_s(union * row_bytes) + 4 * union * c.wire_s_per_byte, whole)
                unions = unions or union > 0
            else:
                rest += whole
        return {DENSE: dense, SPARSE: (1 + int(unions) + buffers, rest)}

    def predict(self, kinds: list[str]) -> dict[str, float | None]:
        """Predicted seconds of each mode for a sync of ``kinds`` (None = union unknown)."""
        return {
            mode: None if m is None else m[0] * self.latency_s + self.scale * m[1]
            for mode, m in self.model(kinds).items()
        }

    def _choose(self, kinds: list[str]) -> str:
        modelled = self.model(kinds)
        if modelled[SPARSE] is None or not self._has_fp32(kinds):
            mode = SPARSE  # learn the unions first (or no fp32 buffer to carry dense counts)
        else:
            cost = {m: v[0] * self.latency_s + self.scale * v[1] for m, v in modelled.items() if v}
            other = DENSE if self.mode == SPARSE else SPARSE
            mode = other if cost[other] < HYSTERESIS * cost[self.mode] else self.mode
        self._modelled[mode] = modelled[mode]
        return mode

    def _refine(self, mode: str, measured_s: float, latency_s: float | None = None) -> None:
        """Fold agreed measurements of the last ``mode`` sync into the model.

        ``latency_s`` (a tiny all-gather alone, timed in touched-rows mode) refines the
        per-collective latency directly: on a busy host scheduling delays make it far larger
        than the idle-loop probe says. What the latency does not explain of the whole sync
        refines one scale on everything else (bytes, copies, scans). Keeping the two apart
        matters: charging a slow dense sync's bytes to its one collective would make the
        three collectives of a touched-rows sync look costly forever.
        """
        if latency_s is not None and latency_s > 0:
            observed = max(latency_s, 0.5 * self.costs.latency_s)
            self.latency_s = (1 - EMA) * self.latency_s + EMA * observed
        modelled = self._modelled[mode]
        if measured_s <= 0 or modelled is None or modelled[1] <= 0:
            return
        collectives, rest = modelled
        ratio = max(0.0, measured_s - collectives * self.latency_s) / rest
        self.scale = (1 - EMA) * self.scale + EMA * min(SCALE_RANGE[1], max(SCALE_RANGE[0], ratio))

    # ---- SyncEngine ---------------------------------------------------------------------
    def payload(self, weights: bool, states: bool) -> Payload:
        self._began = time.perf_counter()
        kinds = [k for k, on in ((WEIGHTS, weights), (STATES, states)) if on]
        self.mode = self._choose(kinds)
        self.counts[self.mode] += 1
        if self.mode == SPARSE:
            return self._sparse_payload(kinds, weights, states)
        return self._dense_payload(kinds)

    def synced(self, weights: bool, states: bool) -> None:
        super().synced(weights, states)
        if self._began is not None:
            self._measured[self.mode] = time.perf_counter() - self._began
            self._began = None

    def piggyback(self) -> list[int]:
        return [round(self._measured[SPARSE] * 1e6), round(self._gather_s * 1e6)]

    def _gather(self, every: list[torch.Tensor], counts: torch.Tensor) -> None:
        begin = time.perf_counter()
        super()._gather(every, counts)
        self._gather_s = time.perf_counter() - begin

    # ---- the two modes ------------------------------------------------------------------
    def _sparse_payload(self, kinds: list[str], weights: bool, states: bool) -> Payload:
        payload = super().payload(weights, states)
        times = [row[0] for row in self.gathered_extra]
        gathers = [row[1] for row in self.gathered_extra]
        if times and min(times) > 0:  # the last replica to arrive waited least: no skew
            self._refine(SPARSE, min(times) / 1e6, min(gathers) / 1e6 if min(gathers) > 0 else None)
        summed = 0
        union_rows = 0
        for i, kind, rows, _ in self._entries(kinds):
            selected = self.unions.get((i, self._base[kind]))
            union = rows if selected is None else selected.numel()
            self._union[(i, kind)] = float(union)
            union_rows += union
            summed += self.count_sums.get((i, self._base[kind]), 0)
        if summed > 0:
            self._overlap = min(1.0, union_rows / summed)
        return payload

    def _dense_payload(self, kinds: list[str]) -> Payload:
        flush_caches(self.shards)
        cut = self.tracker.cut()
        for kind in kinds:
            self._pending[kind] = cut
        entries = self._entries(kinds)
        local = [float(self.tracker.count_since(i, self._base[k])) for i, k, _, _ in entries]
        seconds = self._measured[DENSE]
        tail = torch.tensor([*local, seconds, seconds * seconds], dtype=torch.float32)

        def landed(mean: torch.Tensor) -> None:
            values = mean.tolist()
            for (i, kind, rows, _), count in zip(entries, values, strict=False):
                estimate = self._replicas * count * self._overlap
                self._union[(i, kind)] = float(min(rows, estimate))
            first, second = values[-2], values[-1]
            if first > 0:  # the fastest replica's time (exact for 2 replicas) from two moments
                spread = max(0.0, second - first * first) ** 0.5
                self._refine(DENSE, max(0.0, first - (self._replicas - 1) ** 0.5 * spread))

        tensors = [
            (t, None)
            for kind in kinds
            for shard in self.shards
            for k, group in self._kinds(shard, kind == WEIGHTS, kind == STATES)
            for t in group
            if k == kind
        ]
        total = sum(rows for _, _, rows, _ in entries)
        self.stats = SparseStats(
            rows_total=total, rows_synced=total, dense_shards=sum(r > 0 for _, _, r, _ in entries)
        )
        return _build_payload(tensors, tail.to(self._device), landed)
