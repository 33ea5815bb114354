"""The sections ``bench/ft_bench.py`` writes: its measurements as markdown (the no-failure
rounds alone, and the full run with the two SIGKILLs). Rendering only; ``ft_bench`` runs."""

from __future__ import annotations

import argparse

from sparse2d.train.config.fault_tolerance import disabled

QUORUM_EVERY = disabled().quorum_every
"""The trainer's default, which every ``ft`` launch of ``ft_bench`` runs with."""


# A printed t table, kept as one: a row per ten degrees of freedom (1-10, 11-20, 21-30) so each
# value can be checked against the textbook's; `ruff format` would put one per line.
T_975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
"""Student's t, two-sided 95%, for 1-30 degrees of freedom (a round count the bench runs,
or consecutive runs pooled)."""


def _interval_text(ratios: list[float]) -> str:
    """The per-round ratios' mean and its 95% t interval: how far the goal's verdict is from
    the rounds' noise (a pair of launches on a shared 2-core box varies by several percent)."""
    n = len(ratios)
    mean = sum(ratios) / n
    if n < 2 or n - 1 > len(T_975):
        return f"mean of the per-round ratios {mean:.3f}"
    sd = (sum((r - mean) ** 2 for r in ratios) / (n - 1)) ** 0.5
    half = T_975[n - 2] * sd / n**0.5
    return (
        f"mean of the per-round ratios {mean:.3f}, 95% interval {mean - half:.3f}-"
        f"{mean + half:.3f} (t, {n - 1} df), {sum(r >= 0.95 for r in ratios)} of {n} rounds >= 0.95"
    )


def clean_markdown(res: dict, args: argparse.Namespace) -> str:
    """The no-failure rounds alone (``--clean-only``)."""
    ft, std = res["clean"]["ft"], res["clean"]["std"]
    mc = res.get("mc", "none")
    ratios = [a["samples_per_s"] / b["samples_per_s"] for a, b in zip(ft, std, strict=True)]
    mean = sum(a["samples_per_s"] for a in ft) / sum(b["samples_per_s"] for b in std)
    return "\n".join(
        [
            f"## Fault tolerance vs the standard launcher, no failure, `train.pipeline={res['pipeline']}`"
            f"{', managed-collision tables (' + mc.upper() + ')' if mc != 'none' else ''}"
            f"{''.join(f', `{kv}`' for kv in res.get('set', []))} "
            "(bench/ft_bench.py --clean-only)",
            "",
            f"2 groups x 2 ranks (`launch/ft_local.sh`) vs one world of 4, L=2 (`launch/local.sh`), "
            f"configs/ft_tiny_cpu.yaml model, data and `log_every` (10)"
            f"{', with ' + ', '.join(f'`{kv}`' for kv in res.get('set', [])) if res.get('set') else ''}"
            f"{', every table managed-collision (`model.managed_collision.kind=' + mc + '`)' if mc != 'none' else ''}"
            ", sync every step, "
            f"{args.steps} steps, each driven by TorchRec's pipeline; rounds alternated, the order "
            "reversed every other round (fault tolerant first in even rounds, standard first in odd "
            "ones: the first launch after other work runs slowest). "
            f"{args.machine}.",
            f"Regenerate: `PYTHONPATH=. .venv/bin/python bench/ft_bench.py --clean-only "
            f"--pipeline {res['pipeline']}{' --mc ' + mc if mc != 'none' else ''} --steps {args.steps} "
            f"--rounds {args.rounds}"
            f"{''.join(f' --set {kv!r}' for kv in res.get('set', []))}"
            f"{' --compare-every1' if 'ft_every1' in res['clean'] else ''}`.",
            "",
            "| round | fault tolerant samples/s | standard samples/s | ratio | AUC ft / std |",
            "|---|---|---|---|---|",
            *[
                f"| {i} | {a['samples_per_s']:.0f} | {b['samples_per_s']:.0f} | {r:.3f} | "
                f"{a['eval_auc']:.4f} / {b['eval_auc']:.4f} |"
                for i, (a, b, r) in enumerate(zip(ft, std, ratios, strict=True))
            ],
            "",
            *(
                [
                    "With a quorum every step (`fault_tolerance.quorum_every=1`, torchft's "
                    "`OptimizerWrapper` pattern; `--compare-every1`), alternated in the same rounds: "
                    + ", ".join(
                        f"{a['samples_per_s']:.0f} ({a['samples_per_s'] / b['samples_per_s']:.3f})"
                        for a, b in zip(res["clean"]["ft_every1"], std, strict=True)
                    )
                    + " samples/s (ratio to the standard launcher). Main-thread ms per step blocked "
                    "on the quorum / the vote / the commit echo, default lease vs every step: "
                    + ", ".join(
                        f"{a['quorum_wait_ms_per_step']:.1f} / {a['vote_wait_ms_per_step']:.1f} / "
                        f"{a['echo_wait_ms_per_step']:.1f} vs "
                        f"{b['quorum_wait_ms_per_step']:.1f} / {b['vote_wait_ms_per_step']:.1f} / "
                        f"{b['echo_wait_ms_per_step']:.1f}"
                        for a, b in zip(ft, res["clean"]["ft_every1"], strict=True)
                    )
                    + f"; quorums formed per run: {', '.join(str(a['quorums']) for a in ft)} vs "
                    + f"{', '.join(str(b['quorums']) for b in res['clean']['ft_every1'])}.",
                    "",
                ]
                if "ft_every1" in res["clean"]
                else []
            ),
            *(
                [
                    "CPU seconds of each launch (user + system of its workers and torchrun agents, "
                    "start-up and the final eval included; the 2 cores are shared by 4 workers, so "
                    "a launch's CPU seconds set its pace), fault tolerant vs standard, by round: "
                    + ", ".join(
                        f"{a['cpu_s']:.0f} vs {b['cpu_s']:.0f} ({a['cpu_s'] / b['cpu_s']:.2f}x)"
                        for a, b in zip(ft, std, strict=True)
                    )
                    + ".",
                    "",
                ]
                if all("cpu_s" in e for e in ft + std)
                else []
            ),
            *(
                [
                    "Main-thread ms per step blocked on the quorum / the commit vote / the commit "
                    "echo (fault tolerant), by round: "
                    + ", ".join(
                        f"{a['quorum_wait_ms_per_step']:.1f} / {a['vote_wait_ms_per_step']:.1f} / "
                        f"{a['echo_wait_ms_per_step']:.1f}"
                        for a in ft
                    )
                    + ".",
                    "",
                ]
                if all("echo_wait_ms_per_step" in a for a in ft)
                else []
            ),
            f"Goal >= 0.95: **{'met' if mean >= 0.95 else 'not met'}** by the ratio of the mean "
            f"samples/s over the rounds, {mean:.4f} (single rounds {min(ratios):.3f}-"
            f"{max(ratios):.3f}: one launch pair varies by a few percent on this shared box; "
            f"{_interval_text(ratios)}). "
            "Samples/s count the training steps "
            "on both sides: the fault-tolerant group's join (its first quorum, which waits for every "
            "planned group, and the step-0 heal) is start-up, like the standard world's rendezvous. "
            "Per step, a fault-tolerant group runs the in-group DDP all-reduce, ONE cross-group "
            "all-reduce carrying the embedding copies, the dense gradients and the control vector "
            "(fingerprint bytes, NaN/inf flag), the group's commit vote (one SUM all-reduce of "
            "two flags over the group, `sparse2d.ft.step_vote.GroupVote`; it lands at the next forward, "
            "overlapping the pipeline's next input all-to-all and data, except for the steps the "
            "trainer evaluates or saves after: `sparse2d.ft.commit`), the commit echo (one "
            "float over the quorum), where the lease is kept the group's agreement on it (one flag "
            "over the group, `QuorumLease.reuses`: its wait, counted with the echo's, is the skew "
            "between the group's ranks) and the write-back from the copies, plus torchft's quorum "
            f"RPC (manager server -> lighthouse) every `quorum_every` ({QUORUM_EVERY}) committed "
            "steps and after any failed step; the standard world runs DDP's all-reduce and, after "
            "the step, the replica sync (`sparse2d/sync/policy.py`). The quorum is joined before the forward, "
            "not the backward: a live group's heal capture runs on torchft's quorum thread and the "
            "forward already changes captured state (FBGEMM's iteration counter, managed-collision "
            "remaps) (docs/fault_tolerance.md).",
        ]
    )


def markdown(res: dict, args: argparse.Namespace) -> str:
    ft, std = res["clean"]["ft"], res["clean"]["std"]
    ratios = [a["samples_per_s"] / b["samples_per_s"] for a, b in zip(ft, std)]
    k, s = res["kill_ft"], res["kill_std"]
    f = lambda v, p=1: "n/a" if v is None else f"{v:.{p}f}"  # noqa: E731
    clean_auc = res["clean_long_ft_auc"]
    lines = [
        "## Fault tolerance on torchft: samples/s and a SIGKILL, vs restart from checkpoint (bench/ft_bench.py)",
        "",
        f"4 gloo CPU processes, configs/ft_tiny_cpu.yaml model and data (global batch 512), sync every "
        f"step, {args.steps} steps; fault tolerant = 2 groups x 2 ranks (`launch/ft_local.sh`), standard = "
        f"one world of 4, L=2 (`launch/local.sh`). {args.machine}.",
        "Regenerate: `PYTHONPATH=. .venv/bin/python bench/ft_bench.py`.",
        "",
        "No failure (alternated rounds; samples/s over the training steps, start-up excluded):",
        "",
        "| round | fault tolerant samples/s | standard samples/s | ratio |",
        "|---|---|---|---|",
        *[
            f"| {i} | {a['samples_per_s']:.0f} | {b['samples_per_s']:.0f} | {r:.3f} |"
            for i, (a, b, r) in enumerate(zip(ft, std, ratios))
        ],
        "",
        f"SIGKILL of rank 1 (of group 1 in fault-tolerant mode) once step {args.kill_at} is logged, "
        f"runs of {args.kill_steps} steps (so that the survivors still train when the killed group "
        "is back):",
        "",
        "| | fault tolerant (torchft, no checkpoint) | standard (restart all, checkpoint every 50) |",
        "|---|---|---|",
        f"| survivors' stall (kill -> next committed step) | {f(k['survivor_stall_s'], 2)} s | every rank stops |",
        f"| time from the kill until the job is past the kill step | {f(k['past_kill_step_s'], 2)} s | {f(s['past_kill_step_s'], 2)} s |",
        f"| killed group back (kill -> its first committed step) | {f(k['group1_down_s'])} s | - |",
        f"| heal (per rank, from the live group's same rank) | {f(k['heal_s'], 3)} s, {k['heal_bytes_per_rank']} bytes | checkpoint load |",
        f"| steps redone | {k['steps_redone']} | {s['steps_redone']} (resumed from step {s['resumed_from']}) |",
        f"| rank-seconds lost | {f(k['rank_seconds_lost'])} (2 ranks x down + 2 x stall) | {f(s['rank_seconds_lost'])} (4 ranks until past the kill step) |",
        f"| samples skipped (group 1's slices while down) | {k['samples_skipped']} | 0 |",
        f"| eval AUC (uninterrupted: {clean_auc:.4f}) | {k['eval_auc']:.4f} | {s['eval_auc']:.4f} |",
        f"| replicas bit-identical at the end | {k['identical']} | - |",
        f"| wall time of the run | {f(k['wall_s'])} s | {f(s['wall_s'])} s |",
        "",
        "Reading it: the fault-tolerant survivors lose one step attempt (a failed commit) and the "
        "lighthouse's 2 s heartbeat timeout; the killed group's downtime is its process start-up "
        "(imports, sharding), during which its slices of the global batch are skipped (counted), "
        "not redone. The standard launcher restarts every rank, reloads the checkpoint and redoes "
        "the steps since it. Timeouts used: lighthouse heartbeat_timeout_ms=2000, join_timeout_ms="
        "5000, quorum_tick_ms=50; fault_tolerance.timeout_s=20 (bench) / 30 (default), "
        "quorum_timeout_s=60, connect_timeout_s=10; torchrun monitor interval 0.1 s. CI runs the "
        "same kill on a smaller model (tests/test_ft_launch.py: 1000 steps of 2x400-row "
        "managed-collision tables driven by TorchRec's pipeline, kill at step >= 120) because a "
        "restart on the loaded 2-core CI box takes 20-40 s, longer than 180 steps of the "
        "issue's 300-step run.",
    ]
    return "\n".join(lines)


def overlap_quorum_markdown(res: dict) -> str:
    """The run that retired ``fault_tolerance.overlap_quorum`` (stored; a new run cannot
    measure it): the quorum overlapped vs blocking, a quorum every step, alternated rounds."""
    clean = res["clean"]
    ft, blocking, std = clean["ft"], clean["ft_blocking"], clean["std"]
    rate = lambda runs: sum(r["samples_per_s"] for r in runs) / len(runs)  # noqa: E731
    return "\n".join(
        [
            "## Overlapped quorum vs blocking quorum, fault tolerance (bench/ft_bench.py, retired "
            "option)",
            "",
            "2 groups x 2 ranks (`launch/ft_local.sh`) with the quorum RPC overlapped "
            "(`fault_tolerance.overlap_quorum=true`: on a helper thread from `zero_grad()`, "
            "joined by the model's forward) and blocking (the default), beside one world of 4 "
            "(`launch/local.sh`), configs/ft_tiny_cpu.yaml, `train.pipeline="
            f"{res['pipeline']}`, {', '.join(f'`{kv}`' for kv in res['set'])} (a quorum every "
            "step: the overlap's most favourable case; with the default lease of 32 it runs "
            f"at 1 step in 32), {res['steps']} steps a launch, {res['rounds']} rounds "
            f"alternated, the order reversed every other round. {res['machine']}. Measured "
            "with `bench/ft_bench.py --clean-only --pipeline sparse_dist --compare-blocking "
            f"--set fault_tolerance.quorum_every=1 --steps {res['steps']} --rounds "
            f"{res['rounds']}` before the option was retired (the stamp's commit); stored in "
            "bench/results/ft_overlap_quorum.json, re-rendered by `bench/ft_bench.py "
            "--render-overlap-quorum`.",
            "",
            "| round | overlapped samples/s | blocking samples/s | overlapped / blocking | "
            "quorum wait ms/step overlapped / blocking | standard samples/s |",
            "|---|---|---|---|---|---|",
            *[
                f"| {i} | {a['samples_per_s']:.0f} | {b['samples_per_s']:.0f} | "
                f"{a['samples_per_s'] / b['samples_per_s']:.3f} | "
                f"{a['quorum_wait_ms_per_step']:.2f} / {b['quorum_wait_ms_per_step']:.2f} | "
                f"{c['samples_per_s']:.0f} |"
                for i, (a, b, c) in enumerate(zip(ft, blocking, std, strict=True))
            ],
            "",
            f"Overlapped / blocking, ratio of the mean samples/s: {rate(ft) / rate(blocking):.3f} "
            f"(vs the standard launcher: {rate(ft) / rate(std):.3f} overlapped, "
            f"{rate(blocking) / rate(std):.3f} blocking); eval AUC "
            f"{ft[0]['eval_auc']:.4f} / {blocking[0]['eval_auc']:.4f}. The overlap shortens "
            "the main thread's quorum wait by under a millisecond a step and buys no "
            "samples/s: most of the wait is the cross-group barrier, not the RPC. "
            '**Retired** (`docs/fault_tolerance.md`, "The overlapped quorum (retired)"): '
            "naming it is refused with this section's name.",
            "",
        ]
    )
