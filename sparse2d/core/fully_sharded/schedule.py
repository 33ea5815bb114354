"""FULLY_SHARDED 2D: between steps each replica holds 1/G of its group's fused embedding buffers.

Every FBGEMM TBE flat buffer (weights and fused optimizer state) is cut into ``G`` slices;
replica ``i`` keeps slice ``i`` and the TBE's own storage is resized to 0 (its parameter
objects stay, so autograd and per-table views keep pointing at them). Per step and TBE:
all-gather the weights (prefetched at ``forward``) -> lookup -> free -> all-gather weights and
state on the lookup output's gradient -> FBGEMM's fused update -> reduce-scatter(AVG), waited
at the end of the backward. Averaging the updated values is exactly DEFAULT with ``sync()``
every step, optimizer state included, so replicas never diverge (docs/fully_sharded.md).
Surfaces that hand out per-table views materialize first (``surfaces``); library code uses
``gathered()``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist

from sparse2d.core.fully_sharded.slices import (
    FlatSlice,
    Kernel,
    slice_kernels,
)
from sparse2d.patches import glibc_malloc
from sparse2d.sync.ballot import Ballot, Flag
from sparse2d.sync.collectives import AllReduceHook, average_
from sparse2d.sync.guard import GUARD, NON_FINITE, all_finite
from sparse2d.sync.policy import SyncReport
from sparse2d.sync.shards import ShardState, live_tensors

logger = logging.getLogger(__name__)
_INSTANCES = itertools.count()
"""Models built in this process, in order (the same order on every rank): store keys."""
WRITTEN = Flag("written")
"""Something wrote this buffer on this replica since it was gathered; any replica: settle
compares the replicas' values (and averages them if they differ)."""
SETTLE = Ballot(WRITTEN)
"""A kernel's settle vote over its replicas: one copy per buffer (weights, each state)."""


class FullyShardedEmbeddings:
    """Installs the FULLY_SHARDED schedule on every fused kernel of ``groups`` (see module doc).

    Construct it after the replicas are aligned: the slices are cut from the local copy.
    """

    def __init__(
        self,
        groups: list[tuple[list[ShardState], dist.ProcessGroup]],
        global_pg: dist.ProcessGroup,
        check_finite: bool = True,
    ) -> None:
        self.global_pg = global_pg
        self.check_finite = check_finite
        self.groups = groups
        self.materialized_for: str | None = None
        """The surface that last materialized the full buffers (None: 1/G at rest)."""
        self._surfaces_logged: set[str] = set()
        self.surface_timeout_s = float(os.environ.get("SPARSE2D_SURFACE_TIMEOUT_S", "300"))
        """How long a surface waits for the other ranks to call it too (then raises)."""
        self._calls = 0
        self._name = f"{global_pg.group_name}/{next(_INSTANCES)}"
        self.kernels: list[Kernel] = []
        for shards, replica_pg in groups:  # one (shards, replica group) per sharding context
            self.kernels += slice_kernels(shards, replica_pg)
        self._reducing: list[tuple[FlatSlice, dist.Work]] = []
        self._callback_queued = False
        self.bytes_last_step = 0
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        for kernel in self.kernels:
            self._handles.append(
                kernel.tbe.register_forward_pre_hook(
                    lambda _m, _a, k=kernel: self._before_lookup(k)
                )
            )
            self._handles.append(
                kernel.tbe.register_forward_hook(
                    lambda _m, _a, out, k=kernel: self._after_lookup(k, out)
                )
            )
        cpu = any(k.weights.full.device.type == "cpu" for k in self.kernels)
        if cpu and glibc_malloc.PATCHES[0].wanted():
            glibc_malloc.apply()  # the glibc_malloc patch's trigger: freed slices leave RSS
        self._release_all()

    # ---- the schedule ---------------------------------------------------------------
    def prefetch(self) -> None:
        """Start the weight all-gathers of every TBE at rest (called at model forward)."""
        self.settle()
        for kernel in self.kernels:
            self._raise_if_poisoned(kernel)
            work = kernel.weights.gather(kernel.pg)
            if work is not None:
                kernel.gathers.append(work)

    def _before_lookup(self, kernel: Kernel) -> None:
        self.settle()  # a train pipeline may call the sharded modules without our forward
        self._raise_if_poisoned(kernel)
        work = kernel.weights.gather(kernel.pg)
        for pending in [*kernel.gathers, *([work] if work else [])]:
            pending.wait()
        kernel.gathers.clear()

    def _after_lookup(self, kernel: Kernel, output: torch.Tensor) -> None:
        kernel.weights.release()
        if isinstance(output, torch.Tensor) and output.requires_grad and output.grad_fn:
            output.register_hook(lambda _grad, k=kernel: self._before_update(k))
            output.grad_fn.register_hook(lambda _gi, _go, k=kernel: self._after_update(k))

    def _before_update(self, kernel: Kernel) -> None:
        works = [kernel.weights.gather(kernel.pg)]
        works += [s.gather(kernel.pg) for s in kernel.states]
        for work in works:
            if work is not None:
                work.wait()

    def _after_update(self, kernel: Kernel) -> None:
        buffers = kernel.buffers
        if self.check_finite and self._replicas_disagree_finite(kernel):
            kernel.poisoned = True  # keep the local values, average nothing (see sync_check)
            return
        for buffer in buffers:
            self._reducing.append((buffer, buffer.reduce_scatter(kernel.pg)))
            self.bytes_last_step += buffer.nbytes
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)

    def _finish_backward(self) -> None:
        """End of the backward: land the reduce-scatters, drop the full buffers."""
        for buffer, work in self._reducing:
            work.wait()
            buffer.release()
        self._reducing.clear()
        self._callback_queued = False

    def _release_all(self) -> None:
        self.settle()
        for kernel in self.kernels:
            for pending in kernel.gathers:
                pending.wait()
            kernel.gathers.clear()
            for buffer in kernel.buffers:
                if buffer.is_full:
                    buffer.release()

    def _gather_all(self) -> None:
        """Every buffer full again, from the replicas' slices (blocking, collective)."""
        self._release_all()
        for kernel in self.kernels:
            for buffer in kernel.buffers:
                work = buffer.gather(kernel.pg)
                if work is not None:
                    work.wait()

    # ---- NaN/inf guard (the guard's ballot, sparse2d.sync.ballot) ---------------------
    def _replicas_disagree_finite(self, kernel: Kernel) -> bool:
        """True if any replica's updated values hold a NaN/inf (``GUARD`` voted over the
        kernel's replicas, so they all skip its reduce-scatter alike)."""
        kernel.bad_here = not all(all_finite(b._padded_view()[: b.numel]) for b in kernel.buffers)
        marks = {NON_FINITE.name: kernel.bad_here}
        return GUARD.start(marks, kernel.pg, device=kernel.weights.full.device).wait()[NON_FINITE]

    def _raise_if_poisoned(self, kernel: Kernel) -> None:
        if kernel.poisoned:
            raise _sync_error(-1, kernel.tables, dist.get_rank())

    def sync_check(self, step: int) -> None:
        """Raise ``SyncError`` on every rank if a step met a NaN/inf (collective, global).

        One ``GUARD`` vote over the job (found here, or a kernel here is poisoned because a
        replica found one); only then the tables travel (one object all-gather), and the
        ranks that found them are those with tables (every rank reads the same list)."""
        bad = [t for k in self.kernels if k.bad_here for t in k.tables]
        poisoned = any(k.poisoned for k in self.kernels)
        marks = {NON_FINITE.name: bool(bad) or poisoned}
        if not GUARD.start(marks, self.global_pg).wait()[NON_FINITE]:
            return
        world = dist.get_world_size(self.global_pg)
        every: list[list[str] | None] = [None] * world
        dist.all_gather_object(every, bad, group=self.global_pg)
        ranks = [r for r in range(world) if every[r]]
        tables = sorted({t for r in ranks for t in every[r] or []})
        raise _sync_error(step, tables, [dist.get_global_rank(self.global_pg, r) for r in ranks])

    def report(self, step: int) -> SyncReport:
        """What the last step's reduce-scatters moved; runs the job-wide NaN/inf check."""
        start = time.perf_counter()
        self.sync_check(step)
        report = SyncReport(step, self.bytes_last_step, time.perf_counter() - start)
        self.bytes_last_step = 0
        return report

    # ---- access between steps -------------------------------------------------------
    def materialize(self, surface: str) -> None:
        """Bring back every full buffer (weights and states) until the next forward.

        Collective over each replica group: every rank of the job calls the surface (as with
        ``torch.distributed.checkpoint``); checked first on the store (``_all_ranks_reach``),
        so a surface called on some ranks only raises there instead of hanging or pairing
        with another collective. A no-op while already materialized.
        """
        if self.materialized_for is not None:
            return
        self._all_ranks_reach(surface)
        self._gather_all()
        for kernel in self.kernels:
            for buffer in kernel.buffers:
                buffer.mark()
        self.materialized_for = surface
        full = sum(b.nbytes for k in self.kernels for b in k.buffers)
        first = surface not in self._surfaces_logged and not surface.startswith("library")
        self._surfaces_logged.add(surface)
        (logger.info if first else logger.debug)(
            "[sparse2d] FULLY_SHARDED: %s gathered the full embedding buffers (%.1f MiB on this "
            "rank) until the next forward",
            surface,
            full / 2**20,
        )

    def _all_ranks_reach(self, surface: str) -> None:
        """Count this call on the default store; wait until every rank of ``global_pg`` has
        counted it, or raise ``CollectiveCallError`` after ``surface_timeout_s``."""
        from sparse2d.errors import CollectiveCallError

        store = dist.distributed_c10d._get_default_store()
        self._calls += 1
        key = f"sparse2d/fully_sharded/{self._name}/{self._calls}"
        world = dist.get_world_size(self.global_pg)
        arrived = store.add(key, 1)
        deadline, pause = time.monotonic() + self.surface_timeout_s, 0.0005
        while arrived < world:
            if time.monotonic() > deadline:
                raise CollectiveCallError(
                    f"FULLY_SHARDED {surface} gathers the embedding buffers from the replicas, "
                    f"so every rank must call it; {arrived} of {world} ranks did within "
                    f"{self.surface_timeout_s:.0f} s. Call it on every rank (as "
                    "torch.distributed.checkpoint), or use sharding_strategy=DEFAULT."
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
            arrived = store.add(key, 0)

    def settle(self) -> None:
        """Back to 1/G after ``materialize``. A buffer no replica wrote keeps its slice; one
        written anywhere (``load_state_dict``, a state-dict tensor set in place, a sync hook)
        keeps its slice if every replica holds the same values, else the replicas' values are
        averaged (what every step's reduce-scatter does). Collective over each replica group."""
        if self.materialized_for is None:
            return
        self.materialized_for = None
        for kernel in self.kernels:
            buffers = kernel.buffers
            marks = [{WRITTEN.name: b.written()} for b in buffers]
            vote = SETTLE.start_each(marks, kernel.pg, device=kernel.weights.full.device)
            for buffer, tally in zip(buffers, vote.wait_each(), strict=True):
                if tally[WRITTEN] and not buffer.same_on_every_replica(kernel.pg):
                    buffer.reduce_scatter(kernel.pg).wait()
                else:
                    buffer.keep_local_slice()
                buffer.release()

    def run_hook(self, hook: AllReduceHook, include_optimizer_state: bool) -> SyncReport:
        """TorchRec's ``sync()`` with a custom all-reduce under FULLY_SHARDED: the hook gets the
        full per-table weights (and optimizer states), one call per dtype per replica group;
        then each replica re-slices (averaging first if the hook left replicas apart)."""
        start = time.perf_counter()
        self.materialize("sync() with a custom all-reduce hook")
        moved = 0
        for shards, pg in self.groups:
            tensors = live_tensors(shards, weights=True, states=include_optimizer_state)
            average_(tensors, pg, hook)
            moved += sum(t.numel() * t.element_size() for t in tensors)
        self.settle()
        return SyncReport(-1, moved, time.perf_counter() - start)

    @contextlib.contextmanager
    def gathered(self) -> Iterator[None]:
        """Full buffers inside the block (the live shard views are valid there).

        On exit the buffers go back to 1/G by ``settle``: what the block wrote is kept (and
        averaged if replicas wrote different values); views a surface handed out before are
        freed again, as at the next forward. Weights and optimizer states both come back.
        If the block raises, each replica keeps its slice of its local copy (no collective:
        the other ranks may not get there).
        """
        self.materialize("library access (checkpoint, repair)")
        try:
            yield
        except BaseException:
            self.materialized_for = None
            for kernel in self.kernels:
                for buffer in kernel.buffers:
                    if buffer.is_full:
                        buffer.keep_local_slice()
                        buffer.release()
            raise
        self.settle()

    def resident_bytes(self, weights: bool = True, states: bool = False) -> int:
        """Bytes the TBE buffers (and their slices) hold on this rank now."""
        total = 0
        for kernel in self.kernels:
            buffers = ([kernel.weights] if weights else []) + (kernel.states if states else [])
            total += sum(b.resident_bytes() for b in buffers)
        return total

    def close(self) -> None:
        """Uninstall the hooks without gathering (local, no collective; the model is done)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._reducing.clear()


def _sync_error(step: int, tables: list[str], ranks: object) -> Exception:
    from sparse2d.errors import SyncError

    where = f"at step {step}" if step >= 0 else "in an earlier step"
    return SyncError(
        f"FULLY_SHARDED sync {where}: non-finite values (NaN/inf) in table(s) "
        f"{', '.join(sorted(set(tables)))} on global rank(s) {ranks}; the reduce-scatter was "
        "skipped so no replica was poisoned. Restore from the last checkpoint "
        "(sparse2d.checkpoint.load)."
    )


def materialized(model: torch.nn.Module) -> contextlib.AbstractContextManager:
    """``model``'s full embedding buffers inside the block: ``gathered()`` under
    FULLY_SHARDED, nothing to do otherwise (checkpoint, repair and tests use it)."""
    fully_sharded = getattr(model, "fully_sharded", None)
    if isinstance(fully_sharded, FullyShardedEmbeddings):
        return fully_sharded.gathered()
    return contextlib.nullcontext()
