"""A model's replica consistency: align, sync, cadence and all-reduce hook, over every context.

``DMPCollection`` holds one ``ReplicaSync`` and delegates its public ``align_replicas``,
``sync``, ``maybe_sync`` and ``set_all_reduce_hook`` to it. It holds what it syncs (the
contexts, the sync policy, the FULLY_SHARDED schedule, the early-sync helper, the model's
resources), never the model: a back-reference would make every model a reference cycle.
The early-sync helper needs the model's DDP wrapper and gets a weak proxy of the model.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from sparse2d.core.call_forms import adapt_set_all_reduce_hook
from sparse2d.core.contexts import ShardingContext
from sparse2d.core.resources import Resources
from sparse2d.sync.ddp.carried_vote import EarlySync
from sparse2d.sync.fully_sharded import FullyShardedEmbeddings
from sparse2d.sync.landing import LandingPoint
from sparse2d.sync.mc import mc_identity_buffers, mc_sync_for, plain_shards
from sparse2d.sync.multi import PolicySet, merge_reports
from sparse2d.sync.options import SyncOptions, SyncReport
from sparse2d.sync.policy import SyncPolicy
from sparse2d.sync.shards import live_tensors
from sparse2d.sync.transport.collectives import AllReduceHook, broadcast_

PolicyOrSet = SyncPolicy | PolicySet


class ReplicaSync:
    """Keeps the replicas of every sharding context consistent."""

    def __init__(
        self,
        contexts: list[ShardingContext],
        policy: PolicyOrSet,
        early: EarlySync,
        resources: Resources,
    ) -> None:
        self.contexts = contexts
        self.policy = policy
        """The model's sync policy (``model.sync_policy``; fault tolerance replaces it)."""
        self.early = early
        self.resources = resources
        self.fully_sharded: FullyShardedEmbeddings | None = None
        """Set once the FULLY_SHARDED contexts are sliced (after the first alignment)."""

    @classmethod
    def build(
        cls,
        model: nn.Module,
        contexts: list[ShardingContext],
        sliced: list[ShardingContext],
        options: SyncOptions | None,
        hook: AllReduceHook | None,
        pg: dist.ProcessGroup,
        has_mc: bool,
        resources: Resources,
    ) -> ReplicaSync:
        """One sync policy per context (``sliced``: FULLY_SHARDED contexts, averaged by each
        step's reduce-scatter, so their policy syncs nothing), and the early-sync helper.
        ``model`` is read here (its MC tables, its DDP wrapper), never kept strongly."""
        for ctx in contexts:
            mc = mc_sync_for(model, ctx.shards, ctx.replica_pg) if has_mc else None
            ctx.policy = SyncPolicy(
                [] if ctx in sliced else plain_shards(ctx.shards, mc),
                ctx.replica_pg,
                ctx.num_replicas,
                options,
                hook,
                global_pg=pg,
                mc=mc,
            )
        policies = [c.policy for c in contexts if c.policy is not None]
        policy: PolicyOrSet = policies[0] if len(policies) == 1 else PolicySet(policies)
        early = EarlySync(weakref.proxy(model), policy)  # syncs run at the end of a backward
        resources.callback(early.close)
        return cls(contexts, policy, early, resources)

    def align(self, include_optimizer_state: bool = True) -> None:
        """Overwrite every replica's shards with replica-rank 0's copy (every context)."""
        self.resources.check_open("align replicas")
        for ctx in self.contexts:
            if ctx.num_replicas == 1:
                continue
            tensors = live_tensors(ctx.shards, weights=True, states=include_optimizer_state)
            tensors += mc_identity_buffers(ctx.policy)
            with self._full_buffers(), torch.no_grad():
                broadcast_(tensors, ctx.replica_pg, src_group_rank=0)
        self.policy.reset()

    def sync(self, include_optimizer_state: bool = True) -> SyncReport:
        """Average weights and fused optimizer state now (``DMPCollection.sync``)."""
        self.resources.check_open("sync")
        report = self.policy.sync_now(include_optimizer_state=include_optimizer_state)
        if self.fully_sharded is None:
            return report
        reports = [report, self.fully_sharded.report(-1)]
        if self.policy.hook is not None:  # TorchRec calls the hook under FULLY_SHARDED too
            reports.append(self.fully_sharded.run_hook(self.policy.hook, include_optimizer_state))
        return merge_reports(reports)

    def maybe_sync(self, step: int) -> SyncReport | None:
        """The cadence sync of step ``step`` (``DMPCollection.maybe_sync``)."""
        self.resources.check_open("sync")
        report = self.early.take()
        if report is None:
            report = self.policy.step(step)
        self.early.arm(step)
        if self.fully_sharded is None:
            return report
        return merge_reports([r for r in (report, self.fully_sharded.report(step)) if r])

    def set_hook(self, reduce_hook: Callable[..., None] | None) -> None:
        self.policy.hook = adapt_set_all_reduce_hook(reduce_hook)

    def finish(self, point: LandingPoint = LandingPoint.CALL) -> None:
        """Land the syncs in flight at ``point`` (local waits), unless the model is closed."""
        if not self.resources.closed:
            self.policy.finish(point)

    def _full_buffers(self) -> contextlib.AbstractContextManager[None]:
        if self.fully_sharded is None:
            return contextlib.nullcontext()
        return self.fully_sharded.gathered()
