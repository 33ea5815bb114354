"""FULLY_SHARDED 2D: between steps each replica holds 1/G of its group's fused embedding buffers.

With ``G`` replicas of a sharding group, every FBGEMM TBE flat buffer (the weights and each
fused optimizer-state buffer, e.g. row-wise AdaGrad's accumulator) is cut into ``G`` equal
slices (the last one zero-padded); replica ``i`` keeps slice ``i`` in a small tensor of its
own and the TBE's own buffer has its storage resized to 0. The TBE's parameter objects stay
the same (autograd and every per-table view keep pointing at them); only their bytes come
and go. One training step, per TBE::

    forward   all-gather weights     (prefetched at DMPCollection.forward, waited before the lookup)
              lookup                 (full weights, transient)
              free weights           (the forward->backward window holds 1/G)
    backward  all-gather weights+state  (blocking: hook on the lookup output's gradient)
              fused update           (FBGEMM, full shard, transient)
              reduce-scatter(AVG) weights+state  (started right after the update, waited and
                                      freed at the end of the backward: overlaps the other TBEs'
                                      gathers/updates)

The update of each replica uses its own gradient; the reduce-scatter averages the updated
values, which is exactly DEFAULT with ``sync()`` after every step (weights *and* optimizer
state), hence with EXACT_SGD exactly TorchRec 1D. TorchRec's own order (reduce-scatter after
the lookup, all-gather before the backward) leaves a full copy at rest and lets lookups see
un-averaged weights; this schedule does neither.

Optimizer state is sharded and averaged every step like the weights (decision for issue 14):
replicas can never diverge, at rest state costs 1/G too, and ``sync()`` has nothing left to
average. Blocking parts: the backward all-gather (the update needs the values) and the
end-of-backward wait for the reduce-scatters; the forward gather blocks only if no prefetch
was started (e.g. a train pipeline calling the sharded modules directly).

Anything reading the live shard views between steps (checkpoint, repair, tests) must do it
inside ``gathered()``, which restores the full buffers and re-slices afterwards.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    SplitTableBatchedEmbeddingBagsCodegen,
)

from sparse2d.errors import ConfigError
from sparse2d.sync.policy import SyncReport
from sparse2d.sync.tensors import ShardState

logger = logging.getLogger(__name__)
_M_MMAP_THRESHOLD = -3  # mallopt parameter number in glibc's malloc.h

STATE_PREFIXES = ("momentum1", "momentum2")
"""FBGEMM's flat optimizer-state buffers (each ``{prefix}_{dev,host,uvm}``)."""


def _flat_buffer_names(tbe: SplitTableBatchedEmbeddingBagsCodegen, states: int) -> list[str]:
    """Attributes holding the weights and the ``states`` optimizer-state buffers: ``_dev``
    (GPU HBM) or ``_host`` (CPU). UVM/caching placements are refused."""
    managed = {int(EmbeddingLocation.MANAGED.value), int(EmbeddingLocation.MANAGED_CACHING.value)}
    if any(int(p) in managed for p in tbe.weights_placements.tolist()):
        raise ConfigError(
            "sharding_strategy=FULLY_SHARDED needs every embedding table in device (or CPU "
            "host) memory; a TBE holds tables in UVM/managed caching. Use compute kernel "
            "'fused' (HBM), or sharding_strategy=DEFAULT."
        )
    if states > len(STATE_PREFIXES):
        raise ConfigError(
            f"sharding_strategy=FULLY_SHARDED shards up to {len(STATE_PREFIXES)} fused optimizer "
            f"states per table; {tbe.optimizer} keeps {states}. Use SGD/AdaGrad/row-wise AdaGrad "
            "or sharding_strategy=DEFAULT."
        )
    names = []
    for prefix in ("weights", *STATE_PREFIXES[:states]):
        dev = getattr(tbe, f"{prefix}_dev")
        names.append(f"{prefix}_dev" if dev.numel() > 0 else f"{prefix}_host")
    return names


class FlatSlice:
    """One flat TBE buffer cut into ``count`` slices; this replica keeps slice ``index``."""

    def __init__(self, tbe: torch.nn.Module, attr: str, index: int, count: int) -> None:
        self.tbe, self.attr = tbe, attr
        full = getattr(tbe, attr)
        if full.storage_offset() != 0 or not full.is_contiguous():
            raise ConfigError(
                f"FULLY_SHARDED expects {attr} to own its storage (offset 0, contiguous)."
            )
        self.numel = full.numel()
        self.per_slice = -(-self.numel // count)
        self.padded = self.per_slice * count
        self.nbytes = self.padded * full.element_size()
        start = min(index * self.per_slice, self.numel)
        stop = min(start + self.per_slice, self.numel)
        with torch.no_grad():
            self.shard = torch.zeros(self.per_slice, dtype=full.dtype, device=full.device)
            self.shard[: stop - start].copy_(full.detach().reshape(-1)[start:stop])
        self.index = index
        self.is_full = True

    @property
    def full(self) -> torch.Tensor:
        return getattr(self.tbe, self.attr)

    def _padded_view(self) -> torch.Tensor:
        """A flat tensor over the whole (padded) storage with its own version counter, so
        writing through it does not trip autograd's saved-tensor check on the parameter."""
        full = self.full
        view = torch.empty(0, dtype=full.dtype, device=full.device)
        return view.set_(full.untyped_storage(), 0, (self.padded,))

    def gather(self, pg: dist.ProcessGroup) -> dist.Work | None:
        """Restore the full buffer from every replica's slice (async; returns the work)."""
        if self.is_full:
            return None
        self.full.untyped_storage().resize_(self.nbytes)
        self.is_full = True
        return dist.all_gather_into_tensor(self._padded_view(), self.shard, group=pg, async_op=True)

    def reduce_scatter(self, pg: dist.ProcessGroup) -> dist.Work:
        """Average the full buffers of all replicas into this replica's slice (async)."""
        view = self._padded_view()
        view[self.numel :].zero_()
        return dist.reduce_scatter_tensor(
            self.shard, view, op=dist.ReduceOp.AVG, group=pg, async_op=True
        )

    def keep_local_slice(self) -> None:
        """Re-slice from the local full copy (valid when every replica holds the same values)."""
        with torch.no_grad():
            self.shard.copy_(self._padded_view()[self.index * self.per_slice :][: self.per_slice])

    def release(self) -> None:
        self.full.untyped_storage().resize_(0)
        self.is_full = False

    def resident_bytes(self) -> int:
        """Bytes this buffer holds now: the TBE storage (0 at rest) plus the slice."""
        return self.full.untyped_storage().nbytes() + self.shard.untyped_storage().nbytes()


@dataclass(slots=True)
class _Kernel:
    """The slices of one TBE and what is in flight for it."""

    tbe: SplitTableBatchedEmbeddingBagsCodegen
    pg: dist.ProcessGroup
    """The replica group the slices are spread over."""
    tables: list[str]
    weights: FlatSlice
    states: list[FlatSlice]
    gathers: list[dist.Work] = field(default_factory=list)
    poisoned: bool = False
    """A replica met NaN/inf at the last update: nothing was averaged, the step must stop."""
    bad_here: bool = False
    """This rank's own updated values held the NaN/inf."""


def _slice_kernels(shards: list[ShardState], pg: dist.ProcessGroup) -> list[_Kernel]:
    """Cut every fused kernel of ``shards`` into its replicas' slices over ``pg``."""
    index, count = dist.get_rank(pg), dist.get_world_size(pg)
    tables: dict[int, list[str]] = {}
    states: dict[int, int] = {}
    tbes: dict[int, SplitTableBatchedEmbeddingBagsCodegen] = {}
    for shard in shards:
        if shard.kernel is not None:
            tbes.setdefault(id(shard.kernel), shard.kernel)
            tables.setdefault(id(shard.kernel), []).append(shard.table)
            states[id(shard.kernel)] = len(shard.optimizer_states)
    kernels = []
    for key, tbe in tbes.items():
        slices = [FlatSlice(tbe, n, index, count) for n in _flat_buffer_names(tbe, states[key])]
        kernels.append(_Kernel(tbe, pg, tables[key], slices[0], slices[1:]))
    return kernels


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
        self.kernels: list[_Kernel] = []
        for shards, replica_pg in groups:  # one (shards, replica group) per sharding context
            self.kernels += _slice_kernels(shards, replica_pg)
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
        if any(k.weights.full.device.type == "cpu" for k in self.kernels):
            return_freed_memory_to_os()
        self._release_all()

    # ---- the schedule ---------------------------------------------------------------
    def prefetch(self) -> None:
        """Start the weight all-gathers of every TBE at rest (called at model forward)."""
        for kernel in self.kernels:
            self._raise_if_poisoned(kernel)
            work = kernel.weights.gather(kernel.pg)
            if work is not None:
                kernel.gathers.append(work)

    def _before_lookup(self, kernel: _Kernel) -> None:
        self._raise_if_poisoned(kernel)
        work = kernel.weights.gather(kernel.pg)
        for pending in [*kernel.gathers, *([work] if work else [])]:
            pending.wait()
        kernel.gathers.clear()

    def _after_lookup(self, kernel: _Kernel, output: torch.Tensor) -> None:
        kernel.weights.release()
        if isinstance(output, torch.Tensor) and output.requires_grad and output.grad_fn:
            output.register_hook(lambda _grad, k=kernel: self._before_update(k))
            output.grad_fn.register_hook(lambda _gi, _go, k=kernel: self._after_update(k))

    def _before_update(self, kernel: _Kernel) -> None:
        works = [kernel.weights.gather(kernel.pg)]
        works += [s.gather(kernel.pg) for s in kernel.states]
        for work in works:
            if work is not None:
                work.wait()

    def _after_update(self, kernel: _Kernel) -> None:
        buffers = [kernel.weights, *kernel.states]
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
        for kernel in self.kernels:
            for pending in kernel.gathers:
                pending.wait()
            kernel.gathers.clear()
            for buffer in (kernel.weights, *kernel.states):
                if buffer.is_full:
                    buffer.release()

    # ---- NaN/inf guard --------------------------------------------------------------
    def _replicas_disagree_finite(self, kernel: _Kernel) -> bool:
        """True if any replica's updated values hold a NaN/inf (agreed over the replicas)."""
        kernel.bad_here = not all(
            _all_finite(b._padded_view()[: b.numel]) for b in (kernel.weights, *kernel.states)
        )
        flag = torch.tensor([int(kernel.bad_here)], device=kernel.weights.full.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=kernel.pg)
        return bool(flag.item())

    def _raise_if_poisoned(self, kernel: _Kernel) -> None:
        if kernel.poisoned:
            raise _sync_error(-1, kernel.tables, dist.get_rank())

    def sync_check(self, step: int) -> None:
        """Raise ``SyncError`` on every rank if a step met a NaN/inf (collective, global)."""
        bad = [t for k in self.kernels if k.bad_here for t in k.tables]
        poisoned = any(k.poisoned for k in self.kernels)
        world = dist.get_world_size(self.global_pg)
        cuda = dist.get_backend(self.global_pg) == "nccl"
        flags = torch.zeros(world, dtype=torch.int32, device="cuda" if cuda else "cpu")
        flags[dist.get_rank(self.global_pg)] = 2 if bad else int(poisoned)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.global_pg)
        if not bool(flags.any()):
            return
        ranks = torch.nonzero(flags.cpu() == 2).flatten().tolist()
        every: list[list[str] | None] = [None] * world
        dist.all_gather_object(every, bad, group=self.global_pg)
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
    @contextlib.contextmanager
    def gathered(self, states: bool = True) -> Iterator[None]:
        """Full buffers inside the block (the live shard views are valid there).

        On exit each replica keeps its slice of its local full copy: whatever the block
        wrote must be identical on every replica (a checkpoint load, a repair broadcast).
        """
        self._release_all()
        for kernel in self.kernels:
            for work in [kernel.weights.gather(kernel.pg)] + [
                s.gather(kernel.pg) for s in (kernel.states if states else [])
            ]:
                if work is not None:
                    work.wait()
        try:
            yield
        finally:
            for kernel in self.kernels:
                for buffer in (kernel.weights, *kernel.states):
                    if buffer.is_full:
                        buffer.keep_local_slice()
                        buffer.release()

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

    def remove(self) -> None:
        """Gather everything back and uninstall the hooks (DEFAULT layout again)."""
        self._release_all()
        for kernel in self.kernels:
            for buffer in (kernel.weights, *kernel.states):
                work = buffer.gather(kernel.pg)
                if work is not None:
                    work.wait()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def _all_finite(flat: torch.Tensor) -> bool:
    """One ``sum`` proves a float buffer finite (NaN/inf make it non-finite); only a
    non-finite sum (maybe an overflow of large finite values) pays the exact scan."""
    if not flat.is_floating_point() or bool(torch.isfinite(flat.sum(dtype=torch.float32))):
        return True
    return bool(torch.isfinite(flat).all())


def _sync_error(step: int, tables: list[str], ranks: object) -> Exception:
    from sparse2d.errors import SyncError

    where = f"at step {step}" if step >= 0 else "in an earlier step"
    return SyncError(
        f"FULLY_SHARDED sync {where}: non-finite values (NaN/inf) in table(s) "
        f"{', '.join(sorted(set(tables)))} on global rank(s) {ranks}; the reduce-scatter was "
        "skipped so no replica was poisoned. Restore from the last checkpoint "
        "(sparse2d.checkpoint.load)."
    )


def return_freed_memory_to_os(threshold: int = 1 << 20) -> bool:
    """Fix glibc's mmap threshold so freed large CPU buffers go back to the OS.

    glibc raises its mmap threshold dynamically each time a large mmapped block is freed;
    after the first step the full TBE buffers (and gloo's temporaries) come from the heap
    and stay resident after ``resize_(0)``, so the memory FULLY_SHARDED frees would not be
    returned (measured: RSS between steps above DEFAULT). Process-wide; skipped when
    ``MALLOC_MMAP_THRESHOLD_`` is set or the C library is not glibc.
    """
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") is not None:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        done = bool(libc.mallopt(_M_MMAP_THRESHOLD, threshold))
    except (OSError, AttributeError):
        return False
    if done:
        logger.info("[sparse2d] FULLY_SHARDED: glibc mmap threshold fixed at %d bytes", threshold)
    return done


def materialized(model: torch.nn.Module, states: bool = True) -> contextlib.AbstractContextManager:
    """``model``'s full embedding buffers inside the block: ``gathered()`` under
    FULLY_SHARDED, nothing to do otherwise (checkpoint, repair and tests use it)."""
    fully_sharded = getattr(model, "fully_sharded", None)
    if isinstance(fully_sharded, FullyShardedEmbeddings):
        return fully_sharded.gathered(states)
    return contextlib.nullcontext()
