"""A fault-tolerant step between its cross-group all-reduce and its commit.

``FaultTolerance.finish_step`` sends the step's one all-reduce and starts the group's vote
(``step_vote.GroupVote``); ``FaultTolerance.land`` waits for the vote and commits or discards the
step. With ``defer`` the landing waits for the model's next forward, so the vote's wait (the
skew between the group's ranks) overlaps the pipeline's next input all-to-all and data
instead of blocking ``step()``. The sync's blocking parts wait in the step's channel
(``sparse2d.ft.transport.ManagedChannel``: held, never written into the live shards) until
``land`` commits (writes them back) or discards (drops them) the step. Every rank of a group
decides alike when to land: a quorum's step, the job's last step and a step whose sync failed land at
once, and a step never starts a quorum with a vote pending (a heal's capture reads the
committed state). A step whose vote fails when it lands late was followed by one that kept
the last quorum: this group sends that step's all-reduce anyway (its managers' error
cleared: a peer must not wait for a collective an errored manager skips) with the control
vector's flag set, so every group refuses that step's average, and the commit echo of the
failed step makes every group regroup at the step after. A fault thus costs the live groups
one failed step instead of none (their data slices are skipped, never trained twice); the
trainer defers all steps but those it evaluates or saves after (``sparse2d.train.ft_mode``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from sparse2d.errors import ConfigError, SyncError
from sparse2d.ft import step_vote
from sparse2d.ft.ft_options import FTOptions
from sparse2d.ft.transport import ManagedChannel


@dataclass(slots=True)
class PendingCommit:
    """A step whose vote was started and has not landed."""

    vote: step_vote.GroupVote
    pg_failed: bool
    """This rank's cross-group process group failed (it regroups after landing)."""
    participants: int
    """Groups in the step's quorum."""
    mismatch: bool
    """Another plan in the quorum (the average is refused everywhere)."""


def dense_grads(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The dense gradients the step averages: a zero gradient where none was made, so the
    layout is identical in every group; MP-ZCH identities (integer parameters) left out."""
    out = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if not p.is_floating_point():
                continue
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            out.append(p.grad)
    return out


def refusal(
    options: FTOptions,
    group_bad: bool,
    mismatch: bool,
    fingerprint: int,
    sync_error: SyncError | None,
) -> Exception | None:
    """What a landed step raises on every rank of the group, if anything: a non-finite
    value in the group (it restarts as one and heals) or another plan in the quorum."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    if group_bad:
        return SyncError(
            f"group {options.replica_id} rank {rank}: non-finite dense gradient or "
            "embedding value; its average was refused by every group (this group restarts "
            f"and heals from a live one){': ' + str(sync_error) if sync_error else ''}"
        )
    if mismatch:
        return ConfigError(
            f"groups in the quorum run different plans/models/configs (fingerprint "
            f"{fingerprint:x} differs); start every group with the same config"
        )
    return None


def land_before_reads(model: Any, channel: ManagedChannel, land: Callable[..., Any]) -> Any:
    """Land a pending vote before anything reads the tables: the model's next forward and,
    through the channel's ``settle``, every sync landing point that lands everything (the
    model's surfaces: ``state_dict``, ``load_state_dict``, the fused optimizer's). Returns
    the forward pre-hook's handle."""
    channel.settles = land
    return model.register_forward_pre_hook(before_forward(land))


def before_forward(land: Callable[..., Any]) -> Callable[[Any, Any], None]:
    """The model's forward pre-hook that lands a pending vote (it returns None: a value
    returned by a pre-hook would replace the forward's arguments)."""

    def hook(module: Any, args: Any) -> None:
        land()

    return hook
