"""``engine="auto"``: per sync, the cheaper of a dense and a touched-rows sync, by measured cost.

Every input of a decision is agreed by all replicas, so all take the same branch; values
are the dense engine's to the bit. How it prices and samples the two modes:
docs/sync_strategies.md, "How the touched-rows engines agree on rows".
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from sparse2d.sync.engines.base import Payload, SyncEngine
from sparse2d.sync.engines.choice import DENSE, SPARSE, ModeChooser
from sparse2d.sync.engines.cost import LinkCosts, probe
from sparse2d.sync.engines.dense import DenseEngine
from sparse2d.sync.engines.rows import row_bytes, row_payload
from sparse2d.sync.engines.sparse import (
    STATES,
    WEIGHTS,
    SparseEngine,
    SparseStats,
)
from sparse2d.sync.shards import ShardState, flush_caches, live_tensors

SAMPLE_EVERY = 8
"""Dense syncs carry touched counts and the last sync's time (the tail) once in this many,
and always right after a touched-rows sync: the rest are plain dense syncs (no extra work)."""


class AutoEngine(SparseEngine):
    """Per sync, dense or touched-rows sync (with per-shard dense fallback), by measured cost."""

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
        self.chooser = ModeChooser()
        self.mode = SPARSE
        """Mode of the latest ``payload``."""
        self.counts = {DENSE: 0, SPARSE: 0}
        """Payloads built per mode."""
        self._union: dict[tuple[int, str], float] = {}
        self._overlap = 1.0  # union / sum of replicas' counts, from the last sparse sync
        self._last: tuple[str, float] | None = None  # (mode, modelled s) of the latest sync
        self._last_s = -1.0  # this rank's exposed time of the latest sync
        self._began: float | None = None
        self._dense_syncs = 0
        self._plain = DenseEngine(shards, replica_pg)
        self._model_cache: dict[tuple[str, ...], dict[str, float | None]] = {}
        self._entry_cache: dict[tuple[str, ...], list[tuple[int, str, int, int]]] = {}
        self._dtype_cache: dict[tuple[str, ...], set[torch.dtype]] = {}
        self._index_cache: dict[tuple[str, ...], dict[str, tuple[torch.Tensor, torch.Tensor]]] = {}

    # ---- the model ----------------------------------------------------------------------
    def _entries(self, kinds: list[str]) -> list[tuple[int, str, int, int]]:
        """(shard, kind, rows, bytes per row) of every selection (fixed per ``kinds``)."""
        key = tuple(kinds)
        if key not in self._entry_cache:
            self._entry_cache[key] = [
                (i, kind, shard.rows, sum(row_bytes(t) for t in tensors))
                for i, shard in enumerate(self.shards)
                for kind, tensors in self._kinds(shard, WEIGHTS in kinds, STATES in kinds)
            ]
        return self._entry_cache[key]

    def _entry_index(self, kinds: list[str]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Per kind: positions of its entries in ``_entries(kinds)`` and their shard indices."""
        key = tuple(kinds)
        if key not in self._index_cache:
            out = {}
            for kind in kinds:
                picked = [(j, e[0]) for j, e in enumerate(self._entries(kinds)) if e[1] == kind]
                as_tensor = torch.tensor(picked, dtype=torch.int64, device=self._device)
                out[kind] = (as_tensor[:, 0], as_tensor[:, 1]) if picked else (as_tensor,) * 2
            self._index_cache[key] = out
        return self._index_cache[key]

    def _dtypes(self, kinds: list[str]) -> set[torch.dtype]:
        key = tuple(kinds)
        if key not in self._dtype_cache:
            self._dtype_cache[key] = {
                t.dtype
                for shard in self.shards
                for _, tensors in self._kinds(shard, WEIGHTS in kinds, STATES in kinds)
                for t in tensors
            }
        return self._dtype_cache[key]

    def model(self, kinds: list[str]) -> dict[str, float | None]:
        """Per mode, modelled seconds of a sync of ``kinds``; None = union not known yet.

        Cached until the union estimates change (sparse and sampled dense syncs)."""
        key = tuple(kinds)
        if key not in self._model_cache:
            self._model_cache[key] = self._model(kinds)
        return self._model_cache[key]

    def _model(self, kinds: list[str]) -> dict[str, float | None]:
        c, entries = self.costs, self._entries(kinds)
        scan = sum(rows for _, _, rows, _ in entries) * c.scan_s_per_row
        buffers = max(1, len(self._dtypes(kinds)))
        dense = c.dense_s(sum(r * b for _, _, r, b in entries), buffers) + scan
        rest, unions = scan, False
        for i, kind, rows, width in entries:
            union = self._union.get((i, kind))
            if union is None:
                return {DENSE: dense, SPARSE: None}
            whole = c.dense_s(rows * width, 0)
            if union <= self.crossover * rows:
                rest += min(c.rows_s(union * width) + 4 * union * c.wire_s_per_byte, whole)
                unions = unions or union > 0
            else:
                rest += whole
        return {DENSE: dense, SPARSE: (1 + int(unions) + buffers) * c.latency_s + rest}

    def _choose(self, kinds: list[str], cost: dict[str, float | None]) -> str:
        if cost[SPARSE] is None or torch.float32 not in self._dtypes(kinds):
            return SPARSE  # learn the unions first (or no fp32 buffer to carry dense counts)
        return self.chooser.choose(cost)  # type: ignore[arg-type]

    def _refine(self, previous: tuple[str, float] | None, measured_s: float) -> None:
        if previous is not None:
            self.chooser.refine(*previous, measured_s)

    # ---- SyncEngine ---------------------------------------------------------------------
    def payload(self, weights: bool, states: bool, in_place: bool = False) -> Payload:
        self._began = time.perf_counter()
        kinds = [k for k, on in ((WEIGHTS, weights), (STATES, states)) if on]
        cost = self.model(kinds)
        self.mode = self._choose(kinds, cost)
        self.counts[self.mode] += 1
        previous = self._last
        modelled = cost[self.mode]
        self._last = (self.mode, modelled) if modelled is not None else None
        if self.mode == SPARSE:
            return self._sparse_payload(kinds, weights, states, previous)
        return self._dense_payload(kinds, previous, in_place)

    def synced(self, weights: bool, states: bool) -> None:
        super().synced(weights, states)
        if self._began is not None:
            self._last_s = time.perf_counter() - self._began
            self._began = None

    def observe(self, seconds: float) -> None:
        self._last_s = seconds

    def piggyback(self) -> list[int]:
        return [round(self._last_s * 1e6)]

    # ---- the two modes ------------------------------------------------------------------
    def _sparse_payload(
        self, kinds: list[str], weights: bool, states: bool, previous: tuple[str, float] | None
    ) -> Payload:
        self.tracker.resume()  # if paused: every row counts as touched (correct, not cheap)
        payload = super().payload(weights, states)
        times = [row[0] for row in self.gathered_extra]
        if times and min(times) > 0:  # the last replica to arrive waited least: no skew
            self._refine(previous, min(times) / 1e6)
        summed = 0
        union_rows = 0
        for i, kind, rows, _ in self._entries(kinds):
            selected = self.unions.get((i, self._base[kind]))
            union = rows if selected is None else selected.numel()
            self._union[(i, kind)] = float(union)
            self._model_cache.clear()
            union_rows += union
            summed += self.count_sums.get((i, self._base[kind]), 0)
        if summed > 0:
            self._overlap = min(1.0, union_rows / summed)
        return payload

    def _dense_payload(
        self, kinds: list[str], previous: tuple[str, float] | None, in_place: bool
    ) -> Payload:
        flush_caches(self.shards)
        # Touched rows are needed in the coming interval only if the next sync may read them:
        # a sampled dense sync (its tail), or a sparse one (a switch or an exploration).
        # While dense stays home and no sample is due, lookups are not stamped (their cost
        # is the tracking's whole cost); resumed before the cut, so the rows it marks all
        # touched belong to the interval that ends here, not to the next.
        sample = previous is None or previous[0] != DENSE or self._dense_syncs % SAMPLE_EVERY == 0
        next_samples = (self._dense_syncs + 1) % SAMPLE_EVERY == 0
        settled = self.chooser.home == DENSE and self.chooser.settled()
        tracks = sample or next_samples or not settled  # a sample refines the next choice
        if tracks:
            self.tracker.resume()
        cut = self.tracker.cut()
        if not tracks:
            self.tracker.pause()
        for kind in kinds:
            self._pending[kind] = cut
        entries = self._entries(kinds)
        total = sum(rows for _, _, rows, _ in entries)
        self.stats = SparseStats(
            rows_total=total, rows_synced=total, dense_shards=sum(r > 0 for _, _, r, _ in entries)
        )
        self._dense_syncs += 1
        if not sample:  # a plain dense sync, exactly the dense engine's: nothing to learn
            return self._plain.payload(WEIGHTS in kinds, STATES in kinds, in_place)
        tensors = [(t, None) for t in live_tensors(self.shards, WEIGHTS in kinds, STATES in kinds)]
        # the tail: each entry's local touched count, then this rank's last sync time and its
        # square (one prefix sum per kernel and base; no host sync)
        tail = torch.empty(len(entries) + 2, dtype=torch.float32, device=self._device)
        counts = {b: self.tracker.counts_since(b) for b in {self._base[k] for k in kinds}}
        for kind, (positions, shards) in self._entry_index(kinds).items():
            tail[positions] = counts[self._base[kind]][shards].to(torch.float32)
        tail[-2:] = torch.tensor([self._last_s, self._last_s**2])

        def landed(mean: torch.Tensor) -> None:
            values = mean.tolist()
            for (i, kind, rows, _), count in zip(entries, values, strict=False):
                estimate = self._replicas * count * self._overlap
                self._union[(i, kind)] = float(min(rows, estimate))
            self._model_cache.clear()
            first, second = values[-2], values[-1]
            if first > 0:  # the fastest replica's time (exact for 2 replicas) from two moments
                spread = max(0.0, second - first * first) ** 0.5
                self._refine(previous, max(0.0, first - (self._replicas - 1) ** 0.5 * spread))

        return row_payload(tensors, tail, landed, pool=(self.pool, tuple(kinds)))


def make_engine(kind: str, shards: list[ShardState], replica_pg: dist.ProcessGroup) -> SyncEngine:
    """``dense``: every row. ``sparse``: touched rows only, never dense. ``auto``: per sync the
    cheaper of the two by a cost model measured over the replica group (``sync.engines.auto``)."""
    if kind == "dense":
        return DenseEngine(shards, replica_pg)
    if kind == "auto":
        return AutoEngine(shards, replica_pg)
    return SparseEngine(shards, replica_pg, crossover=1.0)
