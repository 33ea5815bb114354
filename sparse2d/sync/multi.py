"""One sync policy per sharding context, driven as one.

With per-module group sizes (TorchRec's ``submodule_configs``) a model has several
replica groups; each context keeps its own ``SyncPolicy`` (engine, hook,
scaling state) and ``PolicySet`` fans every call out to all of them in context order,
so the trainer, checkpoints and TorchRec's pipelines make the same single call.
"""

from __future__ import annotations

from collections import Counter

from sparse2d.errors import ConfigError
from sparse2d.sync.landing import LandingPoint
from sparse2d.sync.policy import SyncOptions, SyncPolicy, SyncReport
from sparse2d.sync.transport.collectives import AllReduceHook


def merge_reports(reports: list[SyncReport]) -> SyncReport:
    """One report for syncs that ran back to back: bytes and times add up."""
    divergences = [r.divergence for r in reports if r.divergence is not None]
    return SyncReport(
        step=reports[0].step,
        bytes=sum(r.bytes for r in reports),
        seconds=sum(r.seconds for r in reports),
        divergence=max(divergences) if divergences else None,
        wait_seconds=sum(r.wait_seconds for r in reports),
    )


class PolicySet:
    """The ``SyncPolicy`` interface over several policies (every context's)."""

    def __init__(self, policies: list[SyncPolicy]) -> None:
        if not policies:
            raise ConfigError("PolicySet needs at least one policy (one per sharding context)")
        self.policies = policies

    @property
    def options(self) -> SyncOptions:
        return self.policies[0].options

    @property
    def mode_counts(self) -> dict[str, int]:
        return dict(sum((Counter(p.mode_counts) for p in self.policies), Counter()))

    @property
    def votes_carried(self) -> int:
        return sum(p.votes_carried for p in self.policies)

    @property
    def folds(self) -> int:
        return sum(p.folds for p in self.policies)

    @property
    def hook(self) -> AllReduceHook | None:
        return self.policies[0].hook

    @hook.setter
    def hook(self, hook: AllReduceHook | None) -> None:
        for policy in self.policies:
            policy.hook = hook

    @property
    def shards(self) -> list:
        return [s for p in self.policies for s in p.shards]

    def step(self, step: int) -> SyncReport | None:
        reports = [r for p in self.policies if (r := p.step(step)) is not None]
        return merge_reports(reports) if reports else None

    def sync_now(self, step: int = -1, include_optimizer_state: bool = True) -> SyncReport:
        return merge_reports(
            [
                p.sync_now(step, include_optimizer_state=include_optimizer_state)
                for p in self.policies
            ]
        )

    def finish(self, point: LandingPoint = LandingPoint.CALL) -> float:
        return sum(p.finish(point) for p in self.policies)

    def look_ahead(self) -> None:
        for policy in self.policies:
            policy.look_ahead()

    @property
    def lookahead(self) -> bool:
        return any(p.lookahead for p in self.policies)

    def measure_divergence(self) -> float:
        return max(p.measure_divergence() for p in self.policies)

    def reset(self) -> None:
        for policy in self.policies:
            policy.reset()

    @property
    def in_flight(self) -> bool:
        return any(p.in_flight for p in self.policies)

    def land(self) -> float:
        return sum(p.land() for p in self.policies)

    def close(self) -> None:
        for policy in self.policies:
            policy.close()
