"""Options of fault-tolerant 2D training, checked before anything connects.

Timeouts (seconds) and why they default where they do, on CPU/gloo:

- ``timeout_s``: the longest a partition stalls survivors, plus the one step they redo. The
  quorum's process-group setup, the cross-group all-reduce and the commit echo give a silent
  peer ``timeout_s`` less a measured reserve for what a survivor still does once it gives up
  (``sparse2d.ft.transport.WaitBudget``: two median steps and the regroup), counted from the
  step's start for the step's waits and from the echo's start for the echo;
  ``should_commit`` and the heal transfer get ``timeout_s`` itself. A peer killed by SIGKILL
  resets its sockets at once, so this bounds only a peer that hangs or whose link was cut.
- ``quorum_timeout_s``: how long a group waits for a quorum of ``min_replica_size`` groups
  before it stops with ``FaultToleranceError`` (covers "quorum below min_replica_size"); the
  whole quorum (lighthouse, process-group setup, heal) ends within it.
- ``connect_timeout_s``: reaching the lighthouse and the group's manager server.
- The lighthouse's ``heartbeat_timeout_ms`` (``sparse2d.ft.lighthouse``) bounds the survivors'
  stall after a whole group is lost: the quorum waits until the lost group stops heartbeating.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

from sparse2d.errors import ConfigError, refuse_retired_keywords

LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"


RETIRED: dict[str, str] = {
    "overlap_quorum": (
        "overlap_quorum (the step's quorum RPC on a helper thread until the model's forward) "
        "ran no faster than the blocking quorum: bench/RESULTS.md, section ft-overlap-quorum, "
        "gives the run. Drop it: the quorum blocks in start_step, every quorum_every steps"
    ),
}
"""``FTOptions`` fields retired by measurement: field -> what it was and why it went."""


@refuse_retired_keywords
@dataclass(kw_only=True, slots=True)
class FTOptions:
    """How this sharding group takes part in fault-tolerant training (torchft).

    No sync cadence here: the groups average every ``SyncOptions.every`` steps (the model's
    ``sync_options``; the trainer's ``parallel.sync.every``), one cadence whether the replicas
    sit inside one world or across torchft groups. torchft likewise keeps ``sync_every`` on the
    sync algorithm (``LocalSGD``/``DiLoCo``), not on the ``Manager``."""

    retired_keys: ClassVar[dict[str, str]] = RETIRED
    """Fields removed after measurement (``refuse_retired_keywords``; the config loader
    refuses them with the same line)."""

    replica_id: int
    """This group's index ``g`` in ``0..num_groups-1`` (selects its data slice)."""
    num_groups: int
    """Replica groups the job is planned for ``G`` (the global batch is ``G*L*B``)."""
    min_replica_size: int = 1
    """Fewest groups a step may commit with (torchft's ``min_replica_size``)."""
    lighthouse: str | None = None
    """Lighthouse address ``http://host:port``; ``None``: ``$TORCHFT_LIGHTHOUSE``."""
    job: str | None = None
    """The job this group belongs to; ``None``: ``$SPARSE2D_FT_JOB`` (set by the launchers). A
    group refuses a lighthouse marked for, or reached by the groups of, another job
    (``sparse2d.ft.lighthouse.check_job``)."""
    timeout_s: float = 30.0
    """The longest a silent peer (a hung process, a cut link) stalls the live groups, plus the
    step they redo. The quorum's setup, the cross-group all-reduce and the commit echo give
    it this less a measured reserve (two median steps and 0.1 s, at most 10%); the commit
    vote and the heal transfer all of it."""
    quorum_timeout_s: float = 60.0
    """Wait for a quorum of ``min_replica_size`` groups (its setup and heal included) at most
    this long, then fail."""
    connect_timeout_s: float = 10.0
    """Reaching the lighthouse / the group's manager server."""
    start_wait_s: float = 30.0
    """At the first quorum, wait up to this long for all ``num_groups`` groups to join it,
    so that groups launched together start together instead of the first one training alone."""
    quorum_every: int = 32
    """Form a quorum every N committed steps, at the first step and after any step that did
    not commit; between, a step reuses the last quorum's groups (no RPC). A lost group is
    still seen at once: the step's cross-group all-reduce fails, the step does not commit and
    the next one forms a quorum. A restarted group joins the live groups' next quorum, at most
    N steps later. 1: a quorum every step, as torchft's ``OptimizerWrapper``. 32 rather than 8:
    the quorum's wait fell from 1.0-1.9 to 0.3-0.4 ms a step (docs/fault_tolerance.md)."""

    def __post_init__(self) -> None:
        for name in ("num_groups", "min_replica_size", "quorum_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"fault_tolerance.{name}={value!r} must be a whole number >= 1")
        if not isinstance(self.replica_id, int) or not 0 <= self.replica_id < self.num_groups:
            raise ConfigError(
                f"fault_tolerance.replica_id={self.replica_id!r} must be in 0..{self.num_groups - 1} "
                f"(fault_tolerance.num_groups={self.num_groups} groups)"
            )
        if self.min_replica_size > self.num_groups:
            raise ConfigError(
                f"fault_tolerance.min_replica_size={self.min_replica_size} exceeds the "
                f"{self.num_groups} groups of the job (fault_tolerance.num_groups); no quorum "
                "could ever form"
            )
        for name in ("timeout_s", "quorum_timeout_s", "connect_timeout_s", "start_wait_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"fault_tolerance.{name}={getattr(self, name)!r} must be > 0")
        self.job_id()  # a malformed job name: one line before anything connects

    def job_id(self) -> str | None:
        """The job (the option, else ``$SPARSE2D_FT_JOB``), checked for form."""
        from sparse2d.ft.lighthouse import checked_job

        return checked_job(self.job)

    def lighthouse_address(self) -> str:
        """The lighthouse address (the option, else ``$TORCHFT_LIGHTHOUSE``), checked for form."""
        address = self.lighthouse or os.environ.get(LIGHTHOUSE_ENV, "")
        if not address:
            raise ConfigError(
                "fault-tolerant training needs a lighthouse: set fault_tolerance.lighthouse="
                f"http://HOST:PORT or export {LIGHTHOUSE_ENV} (launch/ft_local.sh starts one)"
            )
        host_port = address.split("://", 1)[-1]
        host, _, port = host_port.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(
                f"lighthouse address {address!r} is not http://HOST:PORT "
                f"(fault_tolerance.lighthouse or {LIGHTHOUSE_ENV})"
            )
        return address if "://" in address else f"http://{address}"
