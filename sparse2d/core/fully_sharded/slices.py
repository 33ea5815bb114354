"""FBGEMM's flat TBE buffers cut into one slice per replica (FULLY_SHARDED's storage)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    SplitTableBatchedEmbeddingBagsCodegen,
)

from sparse2d.errors import ConfigError
from sparse2d.sync.ballot import Ballot, Flag, Meaning
from sparse2d.sync.shards import ShardState

STATE_PREFIXES = ("momentum1", "momentum2")
"""FBGEMM's flat optimizer-state buffers (each ``{prefix}_{dev,host,uvm}``)."""
SAME = Flag("same", Meaning.ALL)
"""This replica's full buffer equals replica 0's; every replica: re-slice without averaging."""
REPLICAS = Ballot(SAME)
"""The vote of ``FlatSlice.same_on_every_replica`` over a kernel's replica group."""


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
        self.fingerprint = 0

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

    def mark(self) -> None:
        """Fingerprint the full buffer, to tell later whether anything wrote it (a
        ``load_state_dict``, a state-dict tensor set in place, a sync hook). Version counters
        cannot: TorchRec's per-table views do not all share the buffer's counter."""
        self.fingerprint = fingerprint(self._padded_view()[: self.numel])

    def written(self) -> bool:
        return fingerprint(self._padded_view()[: self.numel]) != self.fingerprint

    def same_on_every_replica(self, pg: dist.ProcessGroup) -> bool:
        """Whether every replica holds the same full buffer (collective over ``pg``)."""
        local = self._padded_view()[: self.numel]
        first = local.clone()
        dist.broadcast(first, src=dist.get_global_rank(pg, 0), group=pg)
        marks = {SAME.name: torch.equal(first, local)}
        return REPLICAS.start(marks, pg, device=local.device).wait()[SAME]

    def resident_bytes(self) -> int:
        """Bytes this buffer holds now: the TBE storage (0 at rest) plus the slice."""
        return self.full.untyped_storage().nbytes() + self.shard.untyped_storage().nbytes()


_CHUNK = 1 << 20
_MULTIPLIERS: dict[torch.device, torch.Tensor] = {}
_INT_VIEWS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def fingerprint(flat: torch.Tensor) -> int:
    """A position-weighted sum of the bits of ``flat`` (int64, wrapping) per chunk, the chunks
    chained by a multiply: any write that changes a value (or moves one) changes it but for
    a ~2^-64 chance. Chunked: the scratch is one chunk's worth, never a copy of the buffer."""
    multipliers = _MULTIPLIERS.get(flat.device)
    if multipliers is None:
        generator = torch.Generator().manual_seed(0x5EED)
        odd = torch.randint(1, 2**62, (_CHUNK,), generator=generator, dtype=torch.int64) | 1
        multipliers = _MULTIPLIERS.setdefault(flat.device, odd.to(flat.device))
    bits = flat.view(_INT_VIEWS[flat.element_size()])
    total = bits.numel()
    for start in range(0, bits.numel(), _CHUNK):
        chunk = bits[start : start + _CHUNK].to(torch.int64)
        weighted = int((chunk * multipliers[: chunk.numel()]).sum())
        total = (total * 0x9E3779B97F4A7C15 + weighted) & 0xFFFFFFFFFFFFFFFF
    return total


@dataclass(slots=True)
class Kernel:
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

    @property
    def buffers(self) -> list[FlatSlice]:
        """The weights, then each optimizer-state buffer."""
        return [self.weights, *self.states]


def slice_kernels(shards: list[ShardState], pg: dist.ProcessGroup) -> list[Kernel]:
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
        kernels.append(Kernel(tbe, pg, tables[key], slices[0], slices[1:]))
    return kernels
