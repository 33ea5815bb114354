"""``DMPCollection``'s replica-consistency methods: align, sync, repair, cadence, hooks.

A mixin so ``collection.py`` keeps construction and lifetime; every method here is public
API of ``sparse2d.DMPCollection`` (and overrides TorchRec's ``DMPCollection`` where it has
the same name).
"""

from __future__ import annotations

from typing import Any

import torch

from sparse2d.compat import adapt_all_reduce
from sparse2d.sync.fully_sharded import materialized
from sparse2d.sync.mc import mc_identity_buffers
from sparse2d.sync.multi import merge_reports
from sparse2d.sync.options import SyncReport
from sparse2d.sync.shards import live_tensors
from sparse2d.sync.transport.collectives import broadcast_


class ReplicaSync:
    """Mixed into ``DMPCollection``: uses its contexts, sync policy, FULLY_SHARDED schedule,
    early-sync helper and resources."""

    _contexts: list[Any]
    _fully_sharded: Any
    _early: Any
    _resources: Any
    sync_policy: Any

    def align_replicas(self, include_optimizer_state: bool = True) -> None:
        """Overwrite every replica's shards with replica-rank 0's copy (every context)."""
        self._resources.check_open("align replicas")
        for ctx in self._contexts:
            if ctx.num_replicas == 1:
                continue
            tensors = live_tensors(ctx.shards, weights=True, states=include_optimizer_state)
            tensors += mc_identity_buffers(ctx.policy)
            with materialized(self), torch.no_grad():
                broadcast_(tensors, ctx.replica_pg, src_group_rank=0)
        self.sync_policy.reset()

    def sync(self, include_optimizer_state: bool = True) -> SyncReport:
        """Average embedding weights and all fused optimizer state over the replica group.

        Covers every context. Routed through the sync policy so its engine, hook and
        compression apply; blocking, and it first lands any transfer still in flight from
        ``maybe_sync``. TorchRec's train pipelines call this every
        ``dmp_collection_sync_interval_batches`` batches. FULLY_SHARDED contexts were averaged
        by every step's reduce-scatter: for them the NaN/inf check runs here, and a custom
        all-reduce hook gets their full weights and states (TorchRec's semantics).
        """
        self._resources.check_open("sync")
        report = self.sync_policy.sync_now(include_optimizer_state=include_optimizer_state)
        if self._fully_sharded is None:
            return report
        reports = [report, self._fully_sharded.report(-1)]
        if self.sync_policy.hook is not None:  # TorchRec calls the hook under FULLY_SHARDED too
            reports.append(
                self._fully_sharded.run_hook(self.sync_policy.hook, include_optimizer_state)
            )
        return merge_reports(reports)

    def repair_from_replicas(self, ranks: list[int], include_dense: bool = True) -> None:
        """Refill ``ranks`` (e.g. restarted with fresh weights) from a healthy replica.

        Collective over the world: every rank calls it with the same ``ranks``. No storage is
        read; see ``sparse2d.checkpoint.repair``.
        """
        self._resources.check_open("repair replicas")
        from sparse2d.checkpoint.repair import repair_from_replicas

        repair_from_replicas(self, ranks, include_dense)

    def maybe_sync(self, step: int) -> SyncReport | None:
        """Sync if the policy's cadence says step ``step`` (0-based) ends an interval.

        FULLY_SHARDED contexts report their step's reduce-scatters (and run the job-wide
        NaN/inf check) at every step.
        """
        self._resources.check_open("sync")
        report = self._early.take()
        if report is None:
            report = self.sync_policy.step(step)
        self._early.arm(step)
        if self._fully_sharded is None:
            return report
        return merge_reports([r for r in (report, self._fully_sharded.report(step)) if r])

    def set_all_reduce_hook(self, reduce_hook: Any) -> None:  # type: ignore[override]
        """Replace the averaging all-reduce: ``hook(tensors, replica_pg)``, or TorchRec's
        ``hook(tensors)`` (1.8) / ``hook(pg, tensors)`` (1.9); ``None`` restores the default."""
        self.sync_policy.hook = adapt_all_reduce(reduce_hook)

    def ensure_reduce_scatter_complete(self) -> None:
        """TorchRec's FULLY_SHARDED wait. Nothing to wait for: our FULLY_SHARDED lands its
        reduce-scatters at the end of each backward (see ``sparse2d.sync.fully_sharded``)."""
