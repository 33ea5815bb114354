"""The invariants of a fault-tolerant run, checked from its records (``bench/chaos.py``, and
``tests/test_bench_chaos_check.py`` with records that break each one).

Read per group ``g`` from ``RUN_DIR/replica_<g>/``: ``commits.jsonl`` (every committed step with
its quorum and the SHA-256 of rank 0's state after the commit: ``sparse2d.ft.commit_log``,
written with ``fault_tolerance.commit_log``) and ``summary.json`` (final step, per-rank state
digests, eval AUC). A run fails on:

- ``split_brain``: one step committed with different weights (two digests for one step:
  two quorums each committed it, or one quorum's groups diverged);
- ``redone``: a group committed a step it had committed before (a survivor's step redone, or
  a relaunched group's rolled back);
- ``not_identical``: a group without a summary, short of the job's last step, or whose
  final per-rank state digests differ from group 0's;
- ``auc``: eval AUC more than ``AUC_TOLERANCE`` below the uninterrupted run's;
- ``launcher``: the launcher's exit code other than 0;
- ``left_behind``: processes, network namespaces or links of the cluster still there.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

AUC_TOLERANCE = 0.005
MARK = "SPARSE2D_EMULATED_CLUSTER"


@dataclass(frozen=True)
class Violation:
    """One broken invariant: its ``name`` (the module docstring's) and what broke it."""

    name: str
    detail: str

    def as_json(self) -> dict[str, str]:
        return asdict(self)


def summaries(run_dir: Path, groups: int) -> dict[int, dict[str, Any] | None]:
    """Each group's ``summary.json`` (None where it wrote none)."""
    out: dict[int, dict[str, Any] | None] = {}
    for g in range(groups):
        path = Path(run_dir) / f"replica_{g}" / "summary.json"
        out[g] = json.loads(path.read_text()) if path.exists() else None
    return out


def split_brain(commits: dict[int, list[dict]]) -> list[Violation]:
    """Steps committed with more than one digest, naming the groups and quorums."""
    by_step: dict[int, dict[str, tuple[int, dict]]] = {}
    for g, rows in commits.items():
        for row in rows:
            by_step.setdefault(int(row["step"]), {}).setdefault(row["digest"], (int(g), row))
    out = []
    for step, seen in sorted(by_step.items()):
        if len(seen) > 1:
            who = ", ".join(
                f"group {g} (quorum {r['quorum_id']}, {r['participants']} groups, digest {d[:12]})"
                for d, (g, r) in seen.items()
            )
            out.append(
                Violation("split_brain", f"step {step} committed with different weights: {who}")
            )
    return out


def _redone(commits: dict[int, list[dict]]) -> list[tuple[int, int, dict, dict]]:
    out = []
    for g, rows in commits.items():
        first: dict[int, dict] = {}
        for row in rows:
            step = int(row["step"])
            if step in first:
                out.append((int(g), step, first[step], row))
            else:
                first[step] = row
    return out


def redone_count(commits: dict[int, list[dict]]) -> int:
    """Committed steps that a group committed again."""
    return len(_redone(commits))


def redone(commits: dict[int, list[dict]]) -> list[Violation]:
    """A group's step committed twice (its two processes named by pid)."""
    return [
        Violation(
            "redone",
            f"group {g} committed step {step} again (pid {again['pid']} at "
            f"{again['time']:.3f}; first pid {once['pid']} at {once['time']:.3f})",
        )
        for g, step, once, again in _redone(commits)
    ]


def not_identical(summary: dict[int, dict[str, Any] | None], steps: int) -> list[Violation]:
    """Every group finished the job's last step with group 0's per-rank state digests."""
    out = []
    reference = summary.get(0) or {}
    for g, s in sorted(summary.items()):
        if s is None:
            out.append(Violation("not_identical", f"group {g} wrote no summary"))
        elif "ended" in s or s.get("final_step") != steps:
            why = s.get("ended", "")
            out.append(
                Violation(
                    "not_identical",
                    f"group {g} ended at step {s.get('final_step')} of {steps} {why}".rstrip(),
                )
            )
        elif g != 0 and s.get("state_digests") != reference.get("state_digests"):
            out.append(
                Violation("not_identical", f"group {g}'s final state digests differ from group 0's")
            )
    return out


def auc(summary: dict[int, dict[str, Any] | None], reference_auc: float | None) -> list[Violation]:
    """Each group's eval AUC at most ``AUC_TOLERANCE`` below the uninterrupted run's."""
    if reference_auc is None:
        return [Violation("auc", "no uninterrupted run's eval AUC to compare with")]
    out = []
    for g, s in sorted(summary.items()):
        value = (s or {}).get("eval_auc")
        if value is not None and value < reference_auc - AUC_TOLERANCE:
            out.append(
                Violation(
                    "auc",
                    f"group {g}'s eval AUC {value:.4f} is {reference_auc - value:.4f} below the "
                    f"uninterrupted run's {reference_auc:.4f} (tolerance {AUC_TOLERANCE})",
                )
            )
    return out


def launcher(rc: int | None) -> list[Violation]:
    return [] if rc == 0 else [Violation("launcher", f"the launcher exited {rc}")]


def left_behind(cluster_id: str) -> dict[str, list[str]]:
    """What of cluster ``cluster_id`` is on this machine now: processes carrying its mark
    (``launch/emulated_cleanup.sh`` finds them the same way), its namespaces and links."""
    processes = []
    mark = f"{MARK}={cluster_id}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if mark in env:
            processes.append(f"{entry.name} {cmd.strip()[:120]}")
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    namespaces = [
        line.split()[0]
        for line in listed.splitlines()
        if line.startswith(f"sparse2d-{cluster_id}-")
    ]
    shown = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    names = [line.split(": ")[1].split("@")[0] for line in shown.splitlines() if ": " in line]
    links = [n for n in names if n in (f"s2b{cluster_id}",) or n.startswith(f"s2v{cluster_id}h")]
    return {"processes": processes, "namespaces": namespaces, "links": links}


def leftovers(left: dict[str, list[str]]) -> list[Violation]:
    return [
        Violation("left_behind", f"{what}: {', '.join(items)}")
        for what, items in left.items()
        if items
    ]


def check(
    commits: dict[int, list[dict]],
    summary: dict[int, dict[str, Any] | None],
    *,
    steps: int,
    launcher_rc: int | None,
    reference_auc: float | None,
    left: dict[str, list[str]],
) -> list[Violation]:
    """Every invariant of the module docstring; empty when the run kept them all."""
    commits = {int(g): rows for g, rows in commits.items()}
    summary = {int(g): s for g, s in summary.items()}
    return [
        *split_brain(commits),
        *redone(commits),
        *not_identical(summary, steps),
        *auc(summary, reference_auc),
        *launcher(launcher_rc),
        *leftovers(left),
    ]


def check_run(
    run_dir: Path,
    groups: int,
    *,
    steps: int,
    launcher_rc: int | None,
    reference_auc: float | None,
    cluster_id: str,
) -> list[Violation]:
    """``check`` on a run directory's records and this machine's state."""
    from sparse2d.ft import commit_log

    commits = {g: commit_log.read(str(Path(run_dir) / f"replica_{g}")) for g in range(groups)}
    return check(
        commits,
        summaries(run_dir, groups),
        steps=steps,
        launcher_rc=launcher_rc,
        reference_auc=reference_auc,
        left=left_behind(cluster_id),
    )
