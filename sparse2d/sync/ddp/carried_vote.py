"""The NaN/inf vote of a sync, carried by the DDP gradient all-reduce, and the sync run
right after it, at the end of the backward.

The guard's own vote (``sparse2d.sync.guard``) is one more world collective per sync. On
the 2-core gloo box that cost the main job 7% of its step time: not the few bytes, but one
more point per step where every rank of the job waits for the slowest. Every step already
has such a point: DDP's gradient all-reduce of the dense parameters, over the same world.
So on a backward that a sync follows (``armed`` by the cadence), DDP's last bucket waits
for the backward's final callback, which scans the values the sync will send and appends
one ``POLICY`` ballot (``sync.ballot``) per sync policy: "I hold a NaN/inf", "I could not
scan" (the touched-rows engine, delayed state: those policies vote in their sync as before,
on every rank alike) and "I folded". A small sync's values ride along too
(``sparse2d.sync.ddp.fold``: its replica average comes out of the same all-reduce, no
collective of its own). Then, still in that callback, ``on_voted`` runs the sync (or
writes the folded average back), so nothing can change a scanned value before it is sent: a
value written after the backward is written after the sync (a hidden sync's landing
overwrites it, else the next sync scans it).

Why the order holds: DDP calls the comm hook of its last bucket before it queues its own
final callback (``Reducer::mark_variable_ready``), so a callback queued from that hook runs
after every node of the backward, the fused embedding updates included, and before DDP
waits for the bucket. Not carried on the first backward through the hook (static-graph DDP
reduces everything from inside its own callback then), nor with a user's comm hook.

Cost of carrying: the last bucket's all-reduce starts after the embedding backward instead
of overlapping it, and its summation order may differ from DDP's in the last bits. The
carrier is attached when some policy can carry a vote (guard on) or fold.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from sparse2d.patches import torch_ddp_comm_hook
from sparse2d.sync.ballot import Ballot, Flag, Meaning, Tally
from sparse2d.sync.ddp.fold import FOLD_DTYPE, Foldable, Folded, FoldSlot, plan_folds, write_slot
from sparse2d.sync.guard import NON_FINITE, FiniteGuard, Verdict, all_finite

logger = logging.getLogger(__name__)

UNSCANNED = Flag("unscanned")
"""This rank could not scan early (only the sync knows its payload): the sync votes itself."""
FOLDED = Flag("folded", Meaning.ALL)
"""This rank began the sync as a fold; it lands only where every rank did."""
POLICY = Ballot(NON_FINITE, UNSCANNED, FOLDED)
"""One policy's flags in the carried bucket (one copy per policy, back to back)."""


class Scannable(Foldable, Protocol):
    """What a carried vote (and a fold, ``Foldable``) needs from a sync policy."""

    guard: FiniteGuard | None
    carrier: tuple[DdpVote, int] | None

    @property
    def may_scan_early(self) -> bool:
        """This policy's syncs can ever be scanned before they start (static options)."""

    def early_scan(self) -> tuple[list[torch.Tensor], bool] | None:
        """(tensors the next cadence sync may send, optimizer state covered), or None when
        they cannot be known before the sync (the vote then runs in the sync)."""

    def fold_due(self, step: int) -> bool: ...

    def fold_begin(self, step: int) -> Folded | None: ...


@dataclass(slots=True)
class CarriedVote:
    """One policy's share of a carried vote."""

    tally: Tally
    """The policy's ``POLICY`` ballot, totalled over the job (``NON_FINITE``: some rank holds
    a NaN/inf in what it scanned)."""
    local_bad: bool
    """This rank holds a NaN/inf in what it scanned."""
    states: bool
    """The scan covered the optimizer state too."""

    def settle(self, guard: FiniteGuard, step: int, states: bool) -> None:
        """Raise ``SyncError`` on every rank if any rank was bad (collective only then)."""
        Verdict(guard, step, self.tally, self.local_bad, weights=True, states=states).wait()


class DdpVote:
    """Carries the NaN/inf votes of ``policies`` in ``ddp``'s last gradient bucket."""

    def __init__(
        self,
        ddp: DistributedDataParallel,
        policies: Sequence[Scannable],
        on_voted: Callable[[], None],
    ) -> None:
        self.ddp = ddp
        self.policies = list(policies)
        self.on_voted = on_voted
        """Runs the sync, in the backward's final callback right after the vote; must not
        raise (DDP is still to finalize its backward): it keeps errors for later."""
        self.pg = ddp.process_group
        self.world = dist.get_world_size(self.pg)
        self.armed = False
        """Carry the vote in the next backward (set by the cadence: a sync follows it)."""
        self.sync_step = 0
        """The step whose cadence sync the armed backward runs."""
        self.slots: list[FoldSlot | None] = [None] * len(self.policies)
        """Per policy, its place in a folded all-reduce (``sync.ddp.fold``); None = not folded."""
        self.backwards = 0
        """Backwards that reached the hook (the same count on every rank)."""
        self._votes: list[CarriedVote | None] = [None] * len(self.policies)
        self.hook_state = _HookState(self)
        ddp.register_comm_hook(self.hook_state, _on_bucket)
        # a user's later DDP comm hook runs inside ours (DDP allows only one): a registered
        # patch of this one instance (sparse2d.patches.torch_ddp_comm_hook)
        torch_ddp_comm_hook.apply(ddp, self.hook_state.register_user_hook)

    @classmethod
    def attach(
        cls, module: Any, policies: Sequence[Scannable], on_voted: Callable[[], None]
    ) -> DdpVote | None:
        """A carrier for ``module`` (a ``DMPCollection``) if it can carry: some policy's
        guarded syncs can be scanned early, the dense part is one DDP over the whole job,
        no comm hook is registered yet, and the comm-hook patch is wanted (opted out, DDP is
        left as it is: every sync votes in its own collective)."""
        ddp = getattr(module, "_dmp_wrapped_module", None)
        if not isinstance(ddp, DistributedDataParallel) or getattr(ddp, "_comm_hooks", None):
            return None
        patch = torch_ddp_comm_hook.PATCHES[0]
        if not patch.wanted():
            return None
        world = dist.get_world_size(ddp.process_group)
        if world != dist.get_world_size():
            return None
        guards = [p.guard for p in policies if p.may_scan_early and p.guard is not None]
        if guards and world != guards[0].world:
            return None
        slots: list[FoldSlot | None] = [None] * len(policies)
        if any(p.may_fold for p in policies):  # the same on every rank: so is the all-gather
            slots = plan_folds(list(policies), ddp.process_group)
        if not guards and not any(slots):
            return None
        carrier = cls(ddp, policies, on_voted)
        carrier.slots = slots
        for index, policy in enumerate(carrier.policies):
            policy.carrier = (carrier, index)
        return carrier

    def take(self, index: int, states: bool) -> CarriedVote | None:
        """Policy ``index``'s carried vote, if its sync runs inside ``on_voted`` and the
        scan covered ``states``; once. The same answer on every rank (all inputs agree), so
        a sync votes itself on every rank or on none."""
        vote, self._votes[index] = self._votes[index], None
        return None if vote is None or (states and not vote.states) else vote

    def detach(self) -> None:
        """Stop carrying (the model is closing): DDP averages plainly from now on."""
        self.hook_state.carrier_ref = None

    # ---- the hook -----------------------------------------------------------------------
    def bucket(self, bucket: dist.GradBucket) -> torch.futures.Future:
        last = bucket.is_last()
        carry = last and self.armed and self.backwards > 0
        if last:
            self.backwards += 1
            self._votes = [None] * len(self.policies)
        if not carry:  # DDP's own average (its default when no hook is registered)
            return allreduce_hook(self.pg, bucket)
        buffer = bucket.buffer()
        self.armed = False  # one sync per arming, even if more backwards follow
        future: torch.futures.Future = torch.futures.Future()
        queue = torch.autograd.Variable._execution_engine.queue_callback  # type: ignore[attr-defined]
        queue(lambda: self._vote(buffer, future))
        return future

    def _vote(self, buffer: torch.Tensor, future: torch.futures.Future) -> None:
        """After the whole backward: fold the due syncs that can, scan, then reduce the
        bucket with the votes (and the folded values) appended."""
        try:
            k, size = len(self.policies), POLICY.size * len(self.policies)
            marks: list[dict[str, float]] = [{} for _ in self.policies]
            regions = self._fold_begin(buffer.dtype, marks)
            n = buffer.numel()
            total = n + size + sum(slot.total for _, slot, _ in regions)
            flat = torch.empty(total, dtype=buffer.dtype, device=buffer.device)
            torch.div(buffer.reshape(-1), self.world, out=flat[:n])
            offset = n + size
            sent: dict[int, tuple[torch.Tensor, bool]] = {}  # policy -> (its slot, states)
            for i, slot, folded in regions:
                write_slot(folded, slot, flat[offset : offset + slot.total])
                if folded is not None and folded.ok:
                    mine = offset + slot.offset
                    sent[i] = (flat[mine : mine + slot.numel], folded.states)
                offset += slot.total
            scans = self._scan(sent, marks)
            POLICY.encode(*marks, out=flat[n : n + size])
            dist.all_reduce(flat, group=self.pg)
            buffer.copy_(flat[:n].view_as(buffer))
            tallies = POLICY.read_each(flat[n : n + size], k, ranks=self.world)
            offset = n + size
            for i, slot, folded in regions:
                if folded is not None and tallies[i][FOLDED]:
                    mine = offset + slot.offset
                    folded.mean = flat[mine : mine + slot.numel].div_(slot.replicas)
                offset += slot.total
            for i, scan in enumerate(scans):
                if scan is not None and not tallies[i][UNSCANNED]:
                    self._votes[i] = CarriedVote(tallies[i], scan[0], scan[1])
            future.set_result(buffer)
        except BaseException as error:  # DDP waits on the future: never leave it pending
            future.set_exception(error)
            raise
        try:
            self.on_voted()
        finally:  # a vote is for the sync right after it only
            self._votes = [None] * len(self.policies)

    def _fold_begin(
        self, dtype: torch.dtype, marks: list[dict[str, float]]
    ) -> list[tuple[int, FoldSlot, Folded | None]]:
        """(policy, slot, its sync begun as a fold) for every policy with a slot whose sync
        is due: the same list on every rank, so every rank reduces the same size (zeros where
        a rank cannot fold). ``FOLDED``: all ranks folded, or nothing lands."""
        regions: list[tuple[int, FoldSlot, Folded | None]] = []
        if dtype != FOLD_DTYPE:  # the bucket's dtype: the same on every rank
            return regions
        for i, (policy, slot) in enumerate(zip(self.policies, self.slots, strict=True)):
            if slot is None or not policy.fold_due(self.sync_step):
                continue
            folded = policy.fold_begin(self.sync_step)
            regions.append((i, slot, folded))
            marks[i][FOLDED.name] = float(folded is not None and folded.ok)
        return regions

    def _scan(
        self, sent: dict[int, tuple[torch.Tensor, bool]], marks: list[dict[str, float]]
    ) -> list[tuple[bool, bool] | None]:
        """Per policy (this rank holds a NaN/inf, the scan covered optimizer state), or
        None where only the sync can tell (``UNSCANNED``). A fold scans its slot: what it
        sends."""
        scans: list[tuple[bool, bool] | None] = []
        for i, policy in enumerate(self.policies):
            scan: tuple[list[torch.Tensor], bool] | None
            if i in sent:
                slot, states = sent[i]
                scan = ([slot] if policy.guard is not None else [], states)
            else:
                scan = policy.early_scan()
            if scan is None:
                marks[i][UNSCANNED.name] = 1
                scans.append(None)
                continue
            bad = not all(all_finite(t) for t in scan[0])
            marks[i][NON_FINITE.name] = float(bad)
            scans.append((bad, scan[1]))
        return scans


class _HookState:
    """What DDP's reducer holds as the comm hook's state.

    The reducer keeps it alive from C++, where Python's garbage collector cannot see the
    reference: a strong reference from here back to the carrier (and through it to the
    model) made every model that ever carried a vote immortal, process groups included.
    So the carrier is held weakly; without one, DDP's own average runs.
    """

    def __init__(self, carrier: DdpVote) -> None:
        self.pg = carrier.pg
        self.carrier_ref: weakref.ref[DdpVote] | None = weakref.ref(carrier)
        self.user: tuple[object, Callable[..., torch.futures.Future]] | None = None

    def carrier(self) -> DdpVote | None:
        return None if self.carrier_ref is None else self.carrier_ref()

    def register_user_hook(self, state: object, hook: Callable[..., Any]) -> None:
        if self.user is not None:
            raise RuntimeError("a DDP comm hook is registered already (one is allowed)")
        self.user = (state, hook)


def _on_bucket(state, bucket):  # type: ignore[no-untyped-def]
    """DDP comm hook: a user's hook, the default average, or the carried vote on the armed
    last bucket.

    Unannotated on purpose: DDP checks hook annotations against the classes themselves, and
    this module's postponed annotations are strings."""
    if state.user is not None:
        return state.user[1](state.user[0], bucket)
    carrier = state.carrier()
    if carrier is None:
        return allreduce_hook(state.pg, bucket)
    return carrier.bucket(bucket)


class EarlySync:
    """A model's cadence syncs run at the end of their backward, with a carried vote.

    ``maybe_sync(step)`` arms the next backward when step ``step + 1`` ends an interval;
    that backward's final callback runs the sync, and the next ``maybe_sync`` returns its
    report (or raises its error, as does the next forward: every rank alike). Armed only
    after an interval with exactly one DDP backward: a loop with several per step (each a
    fused embedding update) must sync after the last one, so it keeps syncing in
    ``maybe_sync`` (DDP's ``no_sync`` accumulation counts once: only the last backward
    reaches the hook). If a loop changes shape after an early sync, that ``maybe_sync``
    syncs again and early syncs stop for good.
    """

    def __init__(self, module: Any, policy: Any) -> None:
        self.module, self.policy = module, policy
        self.carrier: DdpVote | None = None
        self.enabled = True
        """False once a loop ran more than one DDP backward between two ``maybe_sync``."""
        self._tried = False
        self._step = 0
        self._report: Any = None
        self._error: Exception | None = None
        self._backwards = 0  # the carrier's backward count when the early sync ran
        self._seen = 0  # the carrier's backward count at the latest ``arm``

    def arm(self, step: int) -> None:
        """Called after ``maybe_sync(step)``; attaches the carrier at the first call."""
        if not self._tried:
            self._tried = True
            policies = getattr(self.policy, "policies", [self.policy])
            self.carrier = DdpVote.attach(self.module, policies, self._run)
        if self.carrier is not None:
            # only after an interval with exactly one DDP backward: the loop's shape is known
            single = self.carrier.backwards - self._seen == 1
            self._seen = self.carrier.backwards
            due = (step + 2) % self.policy.options.every == 0
            ahead = self.policy.lookahead  # the embedding update lands after the backward
            self.carrier.armed = self.enabled and due and single and not ahead
            self._step = self.carrier.sync_step = step + 1

    def take(self) -> Any:
        """The report of the sync run at the end of the step's backward (None if none ran,
        or if another backward followed it); raises what that sync raised."""
        self.raise_error()
        report, self._report = self._report, None
        if report is not None and self.carrier is not None:
            if self.carrier.backwards != self._backwards:  # the same on every rank
                logger.warning(
                    "[sparse2d] more than one DDP backward between two maybe_sync calls: "
                    "syncing after the step again; syncs no longer run inside the backward "
                    "(wrap all but the last backward in DDP's no_sync() to keep them there)"
                )
                self.enabled = False
                return None
        return report

    def close(self) -> None:
        """Detach the carrier from DDP (the model is closing)."""
        if self.carrier is not None:
            self.carrier.detach()
            self.carrier = None
        self.enabled = False

    def raise_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _run(self) -> None:
        self._backwards = self.carrier.backwards if self.carrier is not None else 0
        try:
            self._report = self.policy.step(self._step)
        except Exception as error:  # DDP still has to finalize this backward
            self._error = error
