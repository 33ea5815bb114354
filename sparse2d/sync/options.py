"""What a sync policy is told (``SyncOptions``) and what one sync did (``SyncReport``).

Kept apart from the policy so configs and reports can be read without the machinery.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from sparse2d.errors import KeyValueError, refuse_retired_keywords
from sparse2d.option_conflicts import first_conflict, sync_settings

ENGINES = ("dense", "sparse", "auto")
RETIRED: dict[str, str] = {
    "overlap": (
        "overlap (start the all-reduce at one sync, land it at the next) won on neither host "
        "measured, the emulated cluster nor the flat host: bench/RESULTS.md, sections "
        "cluster-options and sync-options, give the runs. Drop it: hide (the default) "
        "already hides the sync's all-reduce behind the next step's work, exactly"
    ),
    "compression": (
        "compression (bf16 deltas since the last sync with error feedback, dense engine only) "
        "won on neither host measured, the emulated cluster nor the flat host: "
        "bench/RESULTS.md, sections cluster-options and sync-options, give the runs. Drop "
        "it: syncs send fp32 averages"
    ),
}
"""``SyncOptions`` fields retired by measurement (issue 56 item 1): field -> what it was and
why it went. Naming one (a config key or a keyword) is refused with that line,
never ignored."""


@refuse_retired_keywords
@dataclass(kw_only=True, slots=True)
class SyncOptions:
    """How and when replicas are synchronized. Bad values raise ``KeyValueError`` naming the
    field (the trainer's loader prefixes ``parallel.sync.``). The trainer's ``parallel.sync``
    defaults are these: one default everywhere."""

    retired_keys: ClassVar[dict[str, str]] = RETIRED
    """Fields removed after measurement (``refuse_retired_keywords``; the config loader
    refuses them with the same line)."""

    every: int = 1
    """Average replicas every N optimizer steps (local SGD in between)."""
    include_optimizer_state: bool = True
    """Average fused optimizer state (accumulators, momenta) along with the weights."""
    delayed_optimizer_state: bool = False
    """Average optimizer state one sync behind the weights: the state all-reduce runs during
    the next interval and lands with delta correction (needs ``include_optimizer_state``)."""
    momentum_scaling: bool = False
    """Divide the averaged AdaGrad accumulator growth by the number of replica groups so it
    grows like 1D training's (see ``sparse2d.sync.accumulator_scaling``); needs
    optimizer-state sync."""
    hide: bool = True
    """Start each cadence sync's all-reduce in the background and land it just before the next
    embedding lookup (a forward pre-hook on the fused kernels), hiding it behind the dense
    optimizer step, the next batch's data and its input all-to-all. Exact: nothing updates the
    embeddings in between, so the landed values equal the blocking sync's bit for bit.
    ``False``: each sync blocks until its average has landed."""
    stream: bool = False
    """Stream each interval's sync over the interval: the local shards' rows are cut into
    ``every`` fragments of about equal bytes (weights and optimizer state together) and after
    step ``s`` fragment ``s % every`` is averaged, so every row is still averaged once every
    ``every`` steps, at a fixed phase, while the host links carry ``1/every`` of the tables
    each step instead of all of them in one burst (torchft's Streaming DiLoCo, for tables).
    With ``hide`` a fragment's average runs behind the whole next step and lands at the next
    sync with delta correction (``avg(sent) + (live - sent)``: no row is read half-averaged
    and the step's own updates survive); without ``hide`` each fragment blocks. Replicas are
    never identical mid-stream: ``model.sync()`` (the trainer's last step, a checkpoint save)
    averages every row at once. ``every: 1`` is the ordinary sync. With a touched-rows engine
    (``sparse``, ``auto``) a fragment sends only the rows some replica looked up since its last
    sync (one small bitmap all-reduce agrees on them)."""
    engine: Literal["dense", "sparse", "auto"] = "dense"
    """Which values a sync covers: ``"dense"`` (every row), ``"sparse"`` (only rows some replica
    looked up since the last sync; never dense) or ``"auto"`` (per sync, whichever of the two
    a cost model measured over the replica group at start-up and refined from timed syncs
    predicts cheaper). ``"dense"`` is the default: its sync was the cheaper one on the flat
    host's main job (3.3 vs 6.6 ms a step at a sync every step) and on the emulated cluster's
    1 Gbit/s links (1.17x auto), ``"auto"`` won on its 100 Mbit/s links (1.15x dense;
    bench/RESULTS.md, sections sync-options and cluster-options); the sparse engines
    cost 4 bytes of tracking per embedding row."""
    divergence_every: int = 0
    """Measure replica divergence before every k-th sync (0 = off); reported in ``SyncReport``."""
    divergence_rows: int = 32
    """Rows sampled per local shard for the divergence metric."""
    check_finite: bool = True
    """Before averaging, check every value a sync would send for NaN/inf; if any rank finds
    one, every rank raises ``sparse2d.SyncError`` and no replica changes (see
    ``sparse2d.sync.guard``; one sum per payload buffer and a job-wide vote of one int per
    rank, beside the average where the payload is a copy)."""

    def __post_init__(self) -> None:
        _check_int("every", self.every, 1, "1 = every step")
        _check_int("divergence_every", self.divergence_every, 0, "0 = off")
        _check_int("divergence_rows", self.divergence_rows, 1, "rows sampled per shard")
        for name in (
            "include_optimizer_state",
            "delayed_optimizer_state",
            "momentum_scaling",
            "check_finite",
            "hide",
            "stream",
        ):
            if not isinstance(getattr(self, name), bool):
                raise KeyValueError(name, f"={getattr(self, name)!r} must be True or False.")
        if self.engine not in ENGINES:
            raise KeyValueError("engine", f"={self.engine!r} is not one of {ENGINES}.")
        conflict = first_conflict(sync_settings(self), {"sync.": ""})  # e.g. delay, no state
        if conflict is not None:
            raise KeyValueError(conflict.key, conflict.detail)


def _check_int(name: str, value: object, low: int, meaning: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise KeyValueError(name, f"={value!r} must be an int >= {low} ({meaning}).")


@dataclass(slots=True)
class SyncReport:
    """What one sync did on this rank."""

    step: int
    bytes: int
    """Bytes this rank sent into the replica collectives."""
    seconds: float
    """Time spent in the sync call (the blocking part)."""
    divergence: float | None = None
    """Relative L2 distance to the replica mean just before this sync, when measured."""
    wait_seconds: float = 0.0
    """Time spent landing earlier syncs outside any sync call since the previous report: a
    lookup held by a hidden sync's landing (``hide``, a stream), ``finish_sync``. Sync time
    that ``seconds`` does not hold (a hidden burst's 2.1 s landing wait on the emulated
    cluster was in no report the trainer read)."""


def merge_reports(reports: list[SyncReport]) -> SyncReport:
    """One report for syncs that ran back to back (every context's): bytes and times add up."""
    divergences = [r.divergence for r in reports if r.divergence is not None]
    return SyncReport(
        step=reports[0].step,
        bytes=sum(r.bytes for r in reports),
        seconds=sum(r.seconds for r in reports),
        divergence=max(divergences) if divergences else None,
        wait_seconds=sum(r.wait_seconds for r in reports),
    )
