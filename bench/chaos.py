"""A bad day on the emulated cluster: a seeded random schedule of faults in one fault-tolerant run.

``FT=1 launch/emulated_hosts.sh`` with 3 hosts x 2 ranks (one torchft replica group per host,
``bench/inputs/chaos.yaml``: the tiny fault job, every committed step logged with rank 0's
state digest) trains 3,000 steps while ``schedule(seed)`` strikes, one fault after the
cluster is whole again (every group in a logged step), each once a group logged its step:

- ``host_loss``: SIGKILL every process of one host (the emulator relaunches it; it heals);
- ``partition``: one host's link down 10-40 s;
- ``slow_link``: one host's link 10x slower for 10-30 s;
- ``rank_kill``: SIGKILL one worker (torchrun restarts that group; it heals);
- ``heal_fault``: a host lost, and once its relaunch logged its start (its first quorum and
  heal follow at once) its link cut for 10-20 s, or the host killed again;
- ``two_hosts``: two hosts lost at once (one group trains on alone);
- ``lighthouse``: the lighthouse SIGKILLed and started again after 1-5 s at the same address
  and port (its job name and its marker environment too, as the launcher started it).

The schedule is a pure function of the seed (printed before the run). After the run,
``bench/chaos_check.py`` checks the invariants (no split brain, no committed step redone,
replicas bit-identical, eval AUC within 0.005 of the uninterrupted run's, launcher exit 0,
nothing left behind) and the table reports each fault's survivors' longest stall, heals, and
steps redone; a partition's stall is held against ``fault_tolerance.timeout_s`` plus one step.

Regenerate (root; ~6 min a seed, the reference ~3 min, on 2 cores):
  .venv/bin/python bench/chaos.py --seeds 1,2,3
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import chaos_check  # noqa: E402
from cluster_faults import (  # noqa: E402
    LINK,
    cluster,
    cluster_name,
    launch,
    lose_host,
    namespace_pids,
    records,
    remove_cluster,
    set_link,
    shape,
    tail,
)

from bench.bench_util import RESULTS_DIR, machine_note, publish, stored_stamp  # noqa: E402
from sparse2d.ft import commit_log  # noqa: E402
from sparse2d.train.emulated_topology import link_bits  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONFIG = "bench/inputs/chaos.yaml"
MARKER = "chaos"
HOSTS, NPROC = 3, 2
STEPS = 3000
TIMEOUT_S = 20.0
"""``fault_tolerance.timeout_s`` in the config: a partition's survivor stall is held to it."""
KINDS = (
    "host_loss",
    "partition",
    "slow_link",
    "rank_kill",
    "heal_fault",
    "two_hosts",
    "lighthouse",
)
RESTARTS = 12
"""Host relaunches and torchrun restarts allowed (a host may be struck several times)."""
FAULT_KEYS = ("kind", "at", "host", "hosts", "seconds", "factor", "rank", "then")
"""A scheduled fault's keys (an event adds its times and what it hit)."""
STARTED: list[subprocess.Popen] = []
"""Lighthouses this process started again (reaped once the cluster is gone)."""
WHOLE_TIMEOUT_S = 240.0
"""How long the run waits for every group to log a step together before the next fault."""


def schedule(seed: int, faults: int = 8, steps: int = STEPS, hosts: int = HOSTS) -> list[dict]:
    """The faults of a run, a pure function of its arguments: every kind once, the rest drawn,
    in a shuffled order, each at a drawn step in the run's first 60 % (the rest leaves room for
    the last relaunch to heal and train with the others before the job ends)."""
    if faults < len(KINDS):
        raise ValueError(f"faults={faults}: the schedule holds every kind once ({len(KINDS)})")
    if hosts < 3:
        raise ValueError(f"hosts={hosts}: two hosts lost at once needs a third to survive")
    rng = random.Random(seed)
    kinds = list(KINDS) + [rng.choice(KINDS) for _ in range(faults - len(KINDS))]
    rng.shuffle(kinds)
    at = sorted(rng.sample(range(steps // 20, steps * 6 // 10), faults))
    out = []
    for kind, step in zip(kinds, at):
        fault: dict[str, Any] = {"kind": kind, "at": step, "host": rng.randrange(hosts)}
        if kind == "partition":
            fault["seconds"] = round(rng.uniform(10, 40), 1)
        elif kind == "slow_link":
            fault["seconds"], fault["factor"] = round(rng.uniform(10, 30), 1), 10
        elif kind == "rank_kill":
            fault["rank"] = rng.randrange(NPROC)
        elif kind == "heal_fault":
            fault["then"] = rng.choice(("partition", "kill"))
            fault["seconds"] = round(rng.uniform(10, 20), 1)
        elif kind == "two_hosts":
            fault["hosts"] = sorted(rng.sample(range(hosts), 2))
            del fault["host"]
        elif kind == "lighthouse":
            fault["seconds"] = round(rng.uniform(1, 5), 1)
            del fault["host"]
        out.append(fault)
    return out


def describe(fault: dict) -> str:
    """One line of a scheduled fault."""
    where = f"hosts {fault['hosts']}" if "hosts" in fault else f"host {fault.get('host')}"
    if fault["kind"] == "lighthouse":
        where = "the lighthouse"
    extra = {k: v for k, v in fault.items() if k not in ("kind", "at", "host", "hosts")}
    return (
        f"step >= {fault['at']}: {fault['kind']} ({where}{', ' if extra else ''}"
        + ", ".join(f"{k} {v}" for k, v in extra.items())
        + ")"
    )


# ---- the run -------------------------------------------------------------------------------
def latest(run_dir: Path, group: int) -> dict | None:
    rows = records(run_dir, group)
    return rows[-1] if rows else None


def wait_until(what: str, done: Any, job: subprocess.Popen, run_dir: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done():
            return
        if job.poll() is not None:
            raise RuntimeError(
                f"the launch ended (rc {job.returncode}) before {what}:\n{tail(run_dir)}"
            )
        time.sleep(0.05)
    raise RuntimeError(f"{what}: not within {timeout:.0f} s:\n{tail(run_dir)}")


def whole_since(run_dir: Path, since: float) -> bool:
    """Every group logged a step with every group in it after ``since``."""
    return all(
        any(r["time"] > since and r["participants"] == HOSTS for r in records(run_dir, g))
        for g in range(HOSTS)
    )


def step_now(run_dir: Path) -> int:
    return max((r["step"] for g in range(HOSTS) for r in records(run_dir, g)[-1:]), default=0)


def worker_pid(host: dict, rank: int) -> int:
    """The trainer worker of local rank ``rank`` on ``host`` (not its torchrun agent)."""
    for pid in namespace_pids(host["namespace"]):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"sparse2d.train" in cmd and b"torch.distributed.run" not in cmd:
            if f"LOCAL_RANK={rank}".encode() in env:
                return pid
    raise RuntimeError(f"no worker of local rank {rank} on {host['namespace']}")


def lighthouse_pid(cluster_id: str) -> int:
    """The lighthouse of cluster ``cluster_id`` (marked with its name, outside every host)."""
    mark = f"SPARSE2D_EMULATED_CLUSTER={cluster_id}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"sparse2d.ft.lighthouse" in cmd and mark in env:
            return int(entry.name)
    raise RuntimeError(f"no lighthouse of cluster {cluster_id}")


def lighthouse_command(run_dir: Path, pid: int) -> tuple[list[str], dict[str, str], str]:
    """How to start the lighthouse ``pid`` again, as the launcher started it (its command
    line and environment): the same port (so the groups' ``TORCHFT_LIGHTHOUSE`` reaches it),
    job name and cluster mark (the cluster's cleanup removes it)."""
    cmd = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    env = dict(e.decode().split("=", 1) for e in raw if b"=" in e)
    port = (run_dir / "lighthouse.port").read_text().strip()
    if "--port" in cmd:
        cmd[cmd.index("--port") + 1] = port
    if "--port-file" in cmd:  # written once, by the first start
        i = cmd.index("--port-file")
        del cmd[i : i + 2]
    return cmd, env, port


def strike(fault: dict, run_dir: Path, job: subprocess.Popen, cluster_id: str) -> dict:
    """Apply one fault; returns its event (times, the step it struck at, what it hit)."""
    hosts = cluster(run_dir)["hosts"]
    event: dict[str, Any] = {**fault, "step": step_now(run_dir), "start": time.time()}
    kind = fault["kind"]
    if kind == "host_loss":
        event["killed"] = lose_host(hosts[fault["host"]])
    elif kind in ("partition", "slow_link"):
        host = hosts[fault["host"]]
        if kind == "partition":
            set_link(host, up=False)
        else:
            shape(host, f"{link_bits(LINK) // fault['factor']}bit")
        time.sleep(fault["seconds"])
        set_link(host, up=True) if kind == "partition" else shape(host, LINK)
    elif kind == "rank_kill":
        pid = worker_pid(hosts[fault["host"]], fault["rank"])
        os.kill(pid, signal.SIGKILL)
        event["killed_pid"] = pid
    elif kind == "heal_fault":
        g = fault["host"]
        event["killed"] = lose_host(hosts[g])
        killed_at = event["start"]
        wait_until(
            f"host {g}'s relaunch to start",
            lambda: any(r["time"] > killed_at for r in records(run_dir, g, "start")),
            job,
            run_dir,
            WHOLE_TIMEOUT_S,
        )
        event["second_start"] = time.time()
        host = cluster(run_dir)["hosts"][g]
        if fault["then"] == "partition":
            set_link(host, up=False)
            time.sleep(fault["seconds"])
            set_link(host, up=True)
        else:
            event["killed_again"] = lose_host(host)
    elif kind == "two_hosts":
        event["killed"] = sum(lose_host(hosts[h]) for h in fault["hosts"])
    elif kind == "lighthouse":
        pid = lighthouse_pid(cluster_id)
        cmd, env, port = lighthouse_command(run_dir, pid)
        os.kill(pid, signal.SIGKILL)
        time.sleep(fault["seconds"])
        log = open(run_dir / "lighthouse.log", "a")  # noqa: SIM115 (the child holds it)
        lighthouse = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        STARTED.append(lighthouse)
        event.update(killed_pid=pid, port=int(port), new_pid=lighthouse.pid)
    else:
        raise ValueError(f"fault {kind!r}: choose one of {', '.join(KINDS)}")
    event["end"] = time.time()
    return event


def run(
    seed: int | None,
    run_dir: Path,
    *,
    steps: int = STEPS,
    faults: list[dict] | None = None,
    name_key: str = "",
) -> dict:
    """One launch with ``faults`` (default ``schedule(seed)``; ``seed`` None: none, the
    uninterrupted reference); returns the events, the launcher's exit code and what was left."""
    if faults is None:
        faults = [] if seed is None else schedule(seed, steps=steps)
    name = cluster_name("chaos", name_key or str(seed))
    shutil.rmtree(run_dir, ignore_errors=True)  # records of an earlier run would be read
    job = launch(run_dir, steps, hosts=HOSTS, name=name, config=CONFIG, job=(), restarts=RESTARTS)
    events: list[dict] = []
    error = ""
    try:
        last_end = 0.0
        for fault in faults:
            wait_until(
                f"every group in one step before {fault['kind']}",
                lambda since=last_end: whole_since(run_dir, since),
                job,
                run_dir,
                WHOLE_TIMEOUT_S,
            )
            wait_until(
                f"step {fault['at']}",
                lambda at=fault["at"]: step_now(run_dir) >= at,
                job,
                run_dir,
                WHOLE_TIMEOUT_S,
            )
            events.append(strike(fault, run_dir, job, name))
            last_end = events[-1]["end"]
            print(f"  struck {describe(fault)} at step {events[-1]['step']}", flush=True)
        job.wait(timeout=900)
    except (RuntimeError, subprocess.TimeoutExpired) as failure:
        error = str(failure)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGTERM)
            job.wait(timeout=60)
        for lighthouse in STARTED:  # the launcher's cleanup ended it; reap it here
            lighthouse.wait(timeout=30)
        STARTED.clear()
        # the launcher's trap removed the cluster: what is left now is the product's leak
        left = chaos_check.left_behind(name)
        remove_cluster(name)
    return {
        "seed": seed,
        "schedule": faults,
        "events": events,
        "rc": job.returncode,
        "error": error,
        "left_behind": left,
        "cluster_id": name,
        "tail": tail(run_dir) if job.returncode != 0 or error else "",
        "commits": {g: commit_log.read(str(run_dir / f"replica_{g}")) for g in range(HOSTS)},
        "summaries": chaos_check.summaries(run_dir, HOSTS),
        "train": {
            g: [(r["time"], r["step"], r["participants"]) for r in records(run_dir, g)]
            for g in range(HOSTS)
        },
        "heals": {g: records(run_dir, g, "heal") for g in range(HOSTS)},
        "failed": {g: len(records(run_dir, g, "failed_commit")) for g in range(HOSTS)},
    }


# ---- the figures -----------------------------------------------------------------------------
def _commit_times(commits: list[dict]) -> list[float]:
    return sorted(c["time"] for c in commits)


def step_s(result: dict) -> float:
    """The median seconds between two commits of group 0 before the first fault."""
    first = min((e["start"] for e in result["events"]), default=float("inf"))
    times = [t for t in _commit_times(result["commits"][0]) if t < first]
    gaps = [b - a for a, b in zip(times, times[1:])]
    return statistics.median(gaps) if gaps else 0.0


def stall(result: dict, event: dict, survivors: list[int], until: float = float("inf")) -> float:
    """The survivors' longest time between two commits from the fault's start until
    ``TIMEOUT_S`` after its end (a stall that began in it), among the gaps that ended before
    the next fault struck at ``until``: a gap spanning that strike is the next fault's (a
    group killed there, relaunched slowly under load, would otherwise count as the
    partition's survivor stalling; CI saw 30.5 s that way)."""
    start, end = event["start"], event["end"] + TIMEOUT_S
    longest = 0.0
    for g in survivors:
        times = _commit_times(result["commits"][g])
        before = [t for t in times if t <= start]
        inside = [t for t in times if start < t <= min(end + 60, until)]
        marks = ([before[-1]] if before else []) + inside
        for a, b in zip(marks, marks[1:]):
            if a <= end:
                longest = max(longest, b - a)
    return longest


def struck_hosts(event: dict) -> list[int]:
    if event["kind"] == "lighthouse":
        return []
    return list(event.get("hosts", [event.get("host")]))


def analyse(result: dict, reference_auc: float | None) -> dict:
    """The reported figures of one run and the checker's verdict."""
    violations = chaos_check.check(
        result["commits"],
        result["summaries"],
        steps=STEPS if result.get("steps") is None else result["steps"],
        launcher_rc=result["rc"],
        reference_auc=reference_auc,
        left=result["left_behind"],
    )
    if result["error"]:
        violations.insert(0, chaos_check.Violation("run", result["error"].splitlines()[0]))
    one_step = step_s(result)
    rows = []
    strikes = [e["start"] for e in result["events"][1:]] + [float("inf")]
    for event, until in zip(result["events"], strikes, strict=True):
        hit = struck_hosts(event)
        survivors = [g for g in range(HOSTS) if g not in hit]
        row = {
            "fault": describe({k: v for k, v in event.items() if k in FAULT_KEYS}),
            "step": event["step"],
            "seconds": event["end"] - event["start"],
            "stall_s": stall(result, event, survivors, until),
            "partition": event["kind"] == "partition"
            or (event["kind"] == "heal_fault" and event["then"] == "partition"),
        }
        heals = [h for g in hit for h in result["heals"][g] if h["time"] > event["start"]]
        if heals:
            row["heal_s"] = heals[0]["seconds"]
        rows.append(row)
    partitions = [r["stall_s"] for r in rows if r["partition"]]
    g0 = (result["summaries"].get(0) or {}) if result["summaries"] else {}
    return {
        "seed": result["seed"],
        "violations": [v.as_json() for v in violations],
        "rows": rows,
        "step_s": one_step,
        "partition_stall_s": max(partitions, default=None),
        "partition_bound_s": TIMEOUT_S + one_step,
        "heals": sum(len(h) for h in result["heals"].values()),
        "failed_commits": sum(result["failed"].values()),
        "steps_redone": chaos_check.redone_count(result["commits"]),
        "eval_auc": g0.get("eval_auc"),
        "auc_delta": None
        if reference_auc is None or g0.get("eval_auc") is None
        else g0["eval_auc"] - reference_auc,
        "rc": result["rc"],
    }


def _f(value: object, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def _within(a: dict) -> bool:
    """The seed's longest partition stall is within its bound (none: trivially)."""
    return a["partition_stall_s"] is None or a["partition_stall_s"] <= a["partition_bound_s"]


def markdown(analyses: list[dict], reference_auc: float | None, machine: str) -> str:
    lines = [
        "### A bad day on the cluster: seeded random faults (`bench/chaos.py`)",
        "",
        f"`FT=1 launch/emulated_hosts.sh`: {HOSTS} hosts x {NPROC} ranks, one fault-tolerant "
        f"group per host, links {LINK}, `{CONFIG}` ({STEPS} steps, fault_tolerance.timeout_s="
        f"{TIMEOUT_S:g}); each fault strikes once every group logged a step together again. "
        f"Uninterrupted eval AUC {_f(reference_auc, '.4f')}. Checked by `bench/chaos_check.py` "
        f"(split brain, committed step redone, replicas bit-identical, AUC within 0.005, "
        f"launcher exit 0, nothing left behind). Reference: {machine}.",
        "",
        "Regenerate (root; on a shared box each run under the cluster lock): "
        "`.venv/bin/python bench/chaos.py --reference --seeds 1`, then `--seeds 2` and "
        "`--seeds 3` (each seed is stored as it ends); `--print-schedule` prints a seed's faults. "
        "A survivors' stall counts from a fault's start to timeout_s after its end, so a fault "
        "struck inside that window shares the stall of the one before.",
        "",
    ]
    for a in analyses:
        verdict = (
            "pass"
            if not a["violations"]
            else "FAIL: " + "; ".join(f"{v['name']}: {v['detail']}" for v in a["violations"])
        )
        lines += [
            f"Seed {a['seed']}: checker {verdict}. Launcher rc {a['rc']}, heals {a['heals']}, "
            f"failed commits {a['failed_commits']}, steps redone {a['steps_redone']}, eval AUC "
            f"{_f(a['eval_auc'], '.4f')} ({_f(a['auc_delta'], '+.4f')} vs uninterrupted); "
            f"longest survivor stall in a partition {_f(a['partition_stall_s'], '.2f')} s "
            f"against timeout_s + one step = {_f(a['partition_bound_s'], '.2f')} s "
            f"({'within' if _within(a) else 'OVER'}). {a.get('machine', '')}",
            "",
            "| fault | struck at step | lasted s | survivors' longest stall s | heal s |",
            "|---|---:|---:|---:|---:|",
            *(
                f"| {r['fault']} | {r['step']} | {_f(r['seconds'])} | {_f(r['stall_s'], '.2f')} | "
                f"{_f(r.get('heal_s'), '.2f')} |"
                for r in a["rows"]
            ),
            "",
        ]
    return "\n".join(lines).rstrip() + "\n"


def run_schedule(text: str, steps: int, keep: Path | None) -> None:
    """One run of a schedule given as JSON (e.g. a partition right after a heal, which held
    survivors for a whole cut in some runs: issue 64), its rows printed, nothing stored."""
    faults = json.loads(text)
    for fault in faults:
        unknown = sorted(set(fault) - set(FAULT_KEYS))
        if unknown or fault.get("kind") not in KINDS:
            sys.exit(f"chaos: --faults: {fault}: kind one of {KINDS}, keys of {FAULT_KEYS}")
        print("  " + describe(fault), flush=True)
    if os.geteuid() != 0:
        sys.exit("chaos: needs root (network namespaces, tc), as launch/emulated_hosts.sh")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("chaos: terminated"))
    with tempfile.TemporaryDirectory(prefix="chaos_") as tmp:
        result = run(None, (keep or Path(tmp)) / "schedule", steps=steps, faults=faults)
    result["steps"] = steps
    a = analyse(result, None)
    for row in a["rows"]:
        print(row, flush=True)
    print(f"partition stall {a['partition_stall_s']} s, bound {a['partition_bound_s']:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--print-schedule", action="store_true", help="print and stop")
    parser.add_argument(
        "--reference",
        action="store_true",
        help="run the uninterrupted job again, unless seeds measured against the stored one exist",
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-results-md", action="store_true", help="do not edit RESULTS.md")
    parser.add_argument("--render", action="store_true", help="re-render the stored JSON")
    parser.add_argument("--keep", type=Path, help="keep the run directories here")
    parser.add_argument(
        "--faults",
        help="run this schedule once instead of the seeds' (a JSON list of faults with the "
        f"keys {', '.join(FAULT_KEYS)}), print its rows and store nothing",
    )
    args = parser.parse_args()
    if args.faults:
        run_schedule(args.faults, args.steps, args.keep)
        return
    seeds = [int(s) for s in args.seeds.split(",") if s]
    for seed in seeds:
        print(f"seed {seed} schedule:", flush=True)
        for fault in schedule(seed, steps=args.steps):
            print("  " + describe(fault), flush=True)
    if args.print_schedule:
        return
    path = args.out / "chaos.json"
    stored = json.loads(path.read_text()) if path.exists() else {}
    if args.render:
        for seed, a in stored["analyses"].items():  # each row's fault as scheduled
            for row, event in zip(a["rows"], stored["runs"][seed]["events"]):
                row["fault"] = describe({k: v for k, v in event.items() if k in FAULT_KEYS})
        analyses = [stored["analyses"][k] for k in sorted(stored["analyses"], key=int)]
        text = markdown(analyses, stored["reference_auc"], stored["machine"])
        publish(args, stored, text, "chaos.json", MARKER, stored_stamp(MARKER, args.out))
        return
    # a timeout's SIGTERM unwinds too: each run's ``finally`` removes its cluster
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("chaos: terminated"))
    if os.geteuid() != 0:
        sys.exit("chaos: needs root (network namespaces, tc), as launch/emulated_hosts.sh")
    # each seed is one run of ~6 min, stored as it ends (a held lock of the shared machine
    # covers one run at a time); the uninterrupted reference is run once per job length
    fresh = stored.get("steps") != args.steps or (args.reference and not stored.get("analyses"))
    if fresh:
        stored = {"steps": args.steps, "analyses": {}, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="chaos_") as tmp:
        root = args.keep or Path(tmp)
        if fresh:
            load = os.getloadavg()[0]
            reference = run(None, root / "reference", steps=args.steps, name_key="reference")
            reference["steps"] = args.steps
            stored["machine"] = machine_note(load)
            stored["reference_auc"] = (reference["summaries"].get(0) or {}).get("eval_auc")
            stored["reference_rc"] = reference["rc"]
            stored["reference_violations"] = [
                v.as_json() for v in analyse(reference, stored["reference_auc"])["violations"]
            ]
            print("reference rc", reference["rc"], "eval AUC", stored["reference_auc"], flush=True)
        failed = False
        for seed in seeds:
            load = os.getloadavg()[0]
            result = run(seed, root / f"seed_{seed}", steps=args.steps)
            result["steps"] = args.steps
            a = analyse(result, stored["reference_auc"])
            a["machine"] = machine_note(load)
            stored["analyses"][str(seed)] = a
            stored["runs"][str(seed)] = {
                k: v for k, v in result.items() if k not in ("tail", "commits")
            }
            failed = failed or bool(a["violations"])
            print(f"seed {seed}: rc {a['rc']}, violations {a['violations']}", flush=True)
            if result["tail"]:
                print(result["tail"], flush=True)
    analyses = [stored["analyses"][k] for k in sorted(stored["analyses"], key=int)]
    text = markdown(analyses, stored["reference_auc"], stored["machine"])
    publish(args, stored, text, "chaos.json", MARKER)
    if failed:
        sys.exit("chaos: a seed failed the checker (see above)")


if __name__ == "__main__":
    main()
