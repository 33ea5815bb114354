"""``FaultTolerance``: one sharding group as one torchft replica group.

Each group is its own torchrun world of ``L`` ranks holding a complete copy of the model
(``DMPCollection(model, L)``: ``G=1`` locally; dense parameters under DDP in the group).
Rank ``r`` of every group holds the same shards, and torchft's managed process group joins
rank ``r`` of every live group, so the replica dimension of 2D is torchft's.

Step semantics (``docs/fault_tolerance.md``). FBGEMM updates the embeddings inside the
backward, before anyone knows whether the step commits. So:

- ``start_step`` forms the quorum; a group behind the quorum's step heals from a live group
  there (before its forward, so nothing it computes is lost). While every group commits, a
  quorum is formed only every ``quorum_every`` committed steps and the steps between reuse
  its groups (each step ends with a one-float echo of the commit flags over the quorum, so
  every group regroups at the next step when any failed).
- ``finish_step`` averages the dense gradients over the live groups (every step) and, on the
  sync cadence, the embedding weights and every fused optimizer state tensor, into copies.
- Commit (the group's ranks vote: torchft's ``should_commit`` without its RPC, ``GroupVote``;
  landed in ``step()`` or at the next forward, ``commit``): the dense optimizer steps on the
  averaged gradients and the averaged embeddings are written back.
- Failed commit: the dense step is skipped and each group keeps its own embedding values
  (its local update of this batch); they are averaged at the next successful sync, or a
  group that fell behind heals from one that committed. No group rolls back a committed step.
- The data position advances on every attempt, so no batch is trained twice.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn as nn

from sparse2d.errors import FaultToleranceError, SyncError
from sparse2d.ft import commit, in_world, quorum, replica_sync, step_vote
from sparse2d.ft import state as heal_state
from sparse2d.ft.ft_options import FTOptions
from sparse2d.ft.manager import drop_process_group, torchft_manager
from sparse2d.ft.quorum import START_POLL_S
from sparse2d.ft.transport import ManagedChannel, WaitBudget
from sparse2d.managed_collision.tables import sharded_mc_table_names
from sparse2d.sync.shards import live_tensors


class FaultTolerance:
    """Drive one sharding group through fault-tolerant steps (see the module docstring).

    Usage in a user's loop (``model`` a ``sparse2d.DMPCollection`` over this group's world)::

        ft = FaultTolerance(model, dense_opt, FTOptions(replica_id=g, num_groups=G))
        while ft.step < steps:
            ft.start_step()                      # quorum; heals this group if it is behind
            batch = my_batch(ft.position, g)     # a function of (data position, group)
            model(batch).backward()              # fused embedding update happens here
            ft.finish_step()                     # average over live groups, vote, dense step
        ft.shutdown()
    """

    def __init__(
        self,
        model: nn.Module,
        dense_optimizer: torch.optim.Optimizer,
        options: FTOptions,
        *,
        config_digest: str | Mapping[str, str] = "",
        extra_state: tuple[Callable[[], dict], Callable[[dict], None]] | None = None,
    ) -> None:
        replica_sync.refuse(model)  # every rank, before the lighthouse or any collective
        self.model, self.optimizer, self.options = model, dense_optimizer, options
        self.shards = list(model.shard_states)
        self._has_mc = bool(sharded_mc_table_names(model))
        self._extra = extra_state
        self.config_keys = dict(config_digest) if isinstance(config_digest, Mapping) else {}
        """``{dotted key: value}`` every group must agree on (a refusal names the key)."""
        digest = json.dumps(self.config_keys, sort_keys=True) if self.config_keys else config_digest
        digest = f"{digest}|{in_world.layout_digest(model)}"  # each module's L, replicas
        self.fingerprint = heal_state.fingerprint(model, self.shards, digest)
        self._position = self._participants = 0  # data position; groups in the quorum
        self.slices_skipped = 0
        """Group-steps whose data slice nobody trained (absent groups), over the whole job."""
        self.committed = self.failed = 0
        self.min_participants: int | None = None
        self.heals: list[dict[str, Any]] = []
        self._heal_bytes, self._heal_from = 0, None  # bytes and source of the step's heal
        self._started = False
        self._opened_at = (0.0, 0)  # (time, step) the step's quorum started
        self.waited = {"quorum_s": 0.0, "vote_s": 0.0, "echo_s": 0.0}
        """Seconds spent blocked on the quorum, on the commit vote and on its echo, past the
        first step."""
        self._short = quorum.ShortQuorums(options, lambda: self.participants)
        self.budget = WaitBudget(options.timeout_s)
        """How long this rank's cross-group waits give a silent peer (measured steps)."""
        self._lease = quorum.QuorumLease(
            options.quorum_every, lambda: self._pg, self._drop_process_group, self.budget
        )
        self._pg, self.manager = torchft_manager(
            options, self._restore, self._capture, self.budget.seconds
        )
        self.channel = ManagedChannel(
            self.manager, self._pg, lambda: self.participants, self.budget
        )
        self.policy, self._check_finite = replica_sync.install(
            model, options, self.channel, self.shards, self._has_mc
        )
        self.final_step: int | None = None
        """The job's last step: its sync is forced, so every group ends averaged."""
        self._open = False  # a quorum was formed for the step in progress
        self._sync_error: SyncError | None = None
        self._controls = step_vote.ControlVectors(self.fingerprint)
        self.last_committed: bool | None = None
        """Whether the latest ``finish_step`` committed (a pipeline's ``step()`` hides it)."""
        self._pending: commit.PendingCommit | None = None
        self._poison = False
        self.verdicts: list[bool] = []
        """Every landed step's verdict, in order (a loop reads and clears it)."""
        self.on_commit: Callable[[int], None] | None = None
        """Called with the step's groups on every rank after each commit, the committed state
        in place (the trainer's commit log, ``sparse2d.ft.commit_log``); None: nothing."""
        self._land_hook = commit.land_before_reads(model, self.channel, self.land)

    # ---- heal state (torchft calls these; sparse2d.ft.state) ------------------------------
    def _capture(self) -> dict[str, Any]:
        return heal_state.capture_group(self)

    def _restore(self, state: dict[str, Any]) -> None:
        """torchft's load hook: a heal, applied at once (in ``start_step``, before the
        forward)."""
        heal_state.check_source(self, state["extra"])
        self._heal_bytes = heal_state.restore_group(self, state)
        extra = state["extra"]
        self._heal_from = int(extra["from_group"])
        self._position = int(extra["position"])
        self.slices_skipped = int(extra["slices_skipped"])

    # ---- the step ----------------------------------------------------------------------
    @property
    def step(self) -> int:
        """Committed steps of the job (torchft's step: the quorum's max, healed on join)."""
        return self.manager.current_step()

    @property
    def participants(self) -> int:
        """Groups in the current quorum (as ``quorum.form`` found it)."""
        return self._participants

    @property
    def position(self) -> int:
        """Data position: advances on every attempted step (committed or not)."""
        return self._position

    def start_step(self, expect_position: int | None = None) -> None:
        """Join this step's quorum; heal from a live group when this group is behind.

        ``expect_position``: the data position of the batch the loop already read (a
        pipeline prefetches); a heal that moves the group elsewhere is then refused.

        At the first call the quorum is asked again (every ``START_POLL_S``, up to
        ``start_wait_s``) until every planned group is in it, so that groups launched
        together (at step 0, or from their checkpoints) train together from the start. The number of polls, not the
        clock, bounds the wait, so all ranks of a group take the same decisions.
        """
        if self._open:  # already joined (the trainer opens the first step before a pipeline)
            return
        self.budget.begin_step()
        echoing, voted = time.perf_counter(), self.waited["vote_s"]  # echo: settled first
        if self._pending is not None:  # it lands before any quorum (a heal's capture reads
            self._lease.settle()  # the state); the group's decision: no rank's own verdict
            if self._lease.regroup or (self.step + 1) % self.options.quorum_every == 0:
                self.land()
        self._heal_from = None
        self._opened_at = (time.perf_counter(), self.manager.current_step())
        reuse = self._lease.reuses(self._started, self.step + (self._pending is not None))
        self.waited["echo_s"] += time.perf_counter() - echoing - (self.waited["vote_s"] - voted)
        if reuse:
            self._open = True
            return
        if self._pending is not None:  # the group regroups where this rank's echo said keep:
            self.land()  # the vote lands before any quorum, and its echo with it
            self._lease.settle()
            self._opened_at = (self._opened_at[0], self.manager.current_step())
        self._quorum()
        if self._started:
            self.waited["quorum_s"] += time.perf_counter() - self._opened_at[0]
        if not self._started:  # e.g. all groups start at step 0, or resume one checkpoint
            polls = int(self.options.start_wait_s / START_POLL_S)
            while self.participants < self.options.num_groups and polls > 0:
                time.sleep(START_POLL_S)
                self._quorum()
                polls -= 1
        self._started = self._open = True
        self.budget.begin_step()  # a quorum (a heal) may take long: the waits count from here
        if self._heal_from is not None:
            self._record_heal()
        if expect_position is not None and self._position != expect_position:
            raise FaultToleranceError(  # the group restarts and heals before reading a batch
                f"group {self.options.replica_id}: healed to data position "
                f"{self._position} while the loop (its pipeline) already read the batch of "
                f"position {expect_position}; the group restarts and heals before reading a batch"
            )

    def _record_heal(self) -> None:
        start, before = self._opened_at
        self.heals.append(
            {
                "step": self.manager.current_step(),
                "from_group": self._heal_from,
                "from_step": before,
                "seconds": time.perf_counter() - start,
                "bytes": self._heal_bytes,
            }
        )
        self._heal_from = None

    def _quorum(self) -> None:
        self._participants = quorum.form(self.manager, self.options)
        quorum.agree_on_setup(self.manager)

    def sync_embeddings(self) -> None:
        """The replica sync of this step, into copies (``model.sync()`` does the same; a
        second call in one step does nothing). A non-finite value found by the sync's guard
        is remembered: the step's vote then refuses the average in every group."""
        if self.channel.holding or self._sync_error is not None:
            return
        try:
            self.policy.sync_now(self.step)
        except SyncError as error:  # this group's ranks all found it (the guard's vote)
            self._sync_error = error

    def finish_step(self, force_sync: bool = False, defer: bool = False) -> bool | None:
        """Average over the live groups, vote, and step the dense optimizer on commit.

        Call between the backward and the next step: the embeddings are averaged now unless
        ``model.sync()`` already ran this step (TorchRec's pipelines call it there), the
        dense gradients always. Returns whether the step committed, or None with ``defer``:
        the vote then lands before the model's next forward (``sparse2d.ft.commit``)."""
        self.land()
        m, opts, step, participants = self.manager, self.options, self.step, self.participants
        last = self.final_step is not None and step + 1 >= self.final_step
        if force_sync or last or (step + 1) % self.policy.options.every == 0:
            self.sync_embeddings()
        grads = commit.dense_grads(self.optimizer)
        bad_sync = self._sync_error is not None
        control = self._controls.build(grads, bad_sync or self._poison)  # poison: see ``land``
        self._poison = False
        # ONE all-reduce per dtype: the sync's queued copies, the dense gradients and the
        # control vector travel together, scanned for NaN/inf as sent (``step_vote.SentScan``)
        holding = self.channel.holding  # the sync ran: its parts wait for the commit
        aside = holding and self.channel.sent_aside  # e.g. MC rows
        scan = step_vote.SentScan(
            control,
            grads,
            self._check_finite or not holding,
            live_tensors(self.shards, True, True) if aside else [],
            bad=bad_sync,
        )
        self.channel.sent_aside = False
        self.channel.start_tensors([*grads, control], scan)()
        self.budget.end_step()
        bad_here = scan.bad or bad_sync
        pg_failed = m.errored() is not None
        if pg_failed:
            self._drop_process_group()
        average = step_vote.read_control(control, participants)  # the quorum's, read once
        mismatch = not m.errored() and step_vote.fingerprints_differ(
            average, self.fingerprint, participants
        )
        bad_anywhere = not m.errored() and average[step_vote.NON_FINITE]
        if mismatch or bad_anywhere:  # never apply an average a bad replica took part in
            m.report_error(RuntimeError("NaN/inf, another plan or a failed step in the quorum"))
        self._position += 1  # the attempt used up its batch, committed or not
        self._open = False
        self._pending = commit.PendingCommit(
            step_vote.GroupVote(m, self._pg, opts, bad_here, participants, cut_off=pg_failed),
            pg_failed,
            participants,
            mismatch,
        )
        # late only where every rank of the group decides alike (never its local errors)
        late = defer and self._started and not last and self._sync_error is None
        if late and participants >= opts.min_replica_size:
            return None
        return self.land()

    @property
    def pending(self) -> bool:
        """A step's vote was started and has not landed (``finish_step(defer=True)``)."""
        return self._pending is not None

    def land(self) -> bool | None:
        """Land the pending step's vote, if any, and commit or discard the step: write the
        averages back and step the dense optimizer on commit. Returns whether it committed
        (None when nothing was pending). Runs by itself before the model's next forward,
        before a quorum, before the model's surfaces are read, in ``shutdown`` and ``summary``.
        Late (the next step kept the quorum): a failed step is refused there (``commit``)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        voting = time.perf_counter()
        committed, group_bad, cut_off = pending.vote.land()
        self.waited["vote_s"] += time.perf_counter() - voting
        if self._open and not committed:  # the next step kept the quorum: all groups refuse
            self._poison = True  # it, and this rank sends it (its peers wait for it)
            if not pending.pg_failed:
                self.manager._errored = None
        self._lease.after_vote(committed, pending.pg_failed, pending.participants, cut_off)
        self.last_committed = committed
        self.verdicts.append(committed)
        if committed:
            self.channel.commit()
        else:
            self.channel.discard()
        opts, participants = self.options, pending.participants
        error = commit.refusal(
            opts, group_bad, pending.mismatch, self.fingerprint, self._sync_error
        )
        if error is not None:  # every rank of the group: it restarts as one
            raise error
        if committed:
            self.budget.committed(time.monotonic())
            self.optimizer.step()
            self.committed += 1
            self.slices_skipped += opts.num_groups - participants
            self.min_participants = min(self.min_participants or participants, participants)
            if self.on_commit is not None:
                self.on_commit(participants)
        else:
            self.failed += 1
        self.optimizer.zero_grad(set_to_none=True)
        self._short.after_step(participants < opts.min_replica_size)
        return committed

    def _drop_process_group(self) -> None:
        drop_process_group(self._pg, self.manager)
        self.channel.arena.forget()  # the abandoned all-reduce may still write into it

    def resume(self, step: int, position: int, slices_skipped: int = 0) -> None:
        """Continue from a checkpoint (every group was lost): set the step and data position.

        Call after loading the checkpoint into the model and before the next ``start_step``,
        whose quorum then reports this step; groups behind it heal from the furthest one."""
        self.manager.load_state_dict({"step": step, "batches_committed": 0})
        self._position, self.slices_skipped = position, slices_skipped

    def summary(self) -> dict[str, Any]:
        """The counters a run reports (``committed_steps``, ``failed_commits``, ``heals``...)."""
        self.land()
        return {
            "replica_id": self.options.replica_id,
            "committed_steps": self.committed,
            "failed_commits": self.failed,
            "heals": list(self.heals),
            "group_steps_skipped": self.slices_skipped,
            "min_groups_in_step": self.min_participants,
            "final_step": self.step,
            "data_position": self._position,
            "quorums": self._lease.formed,
            "quorum_wait_s": self.waited["quorum_s"],
            "vote_wait_s": self.waited["vote_s"],
            "echo_wait_s": self.waited["echo_s"],
        }

    def shutdown(self) -> None:
        """Stop this group's manager server and checkpoint server."""
        self.land()
        self._lease.settle()  # the last step's echo: every group is still there for it
        self._land_hook.remove()
        self.manager.shutdown(wait=False)
