"""Faults on the emulated cluster: a host lost, a host's link cut, a host's link slowed.

``FT=1 launch/emulated_hosts.sh``: one fault-tolerant sharding group (a torchft replica
group) per emulated host, the lighthouse outside every host on the bridge, every byte between
groups over the hosts' shaped links. Each fault hits host 1 once its group logged a step
>= ``--at``:

- ``host_loss``: SIGKILL every process in host 1's namespace, its launcher included; the
  emulator (as a cluster scheduler) starts host 1's launch again, which heals from a live group;
- ``partition``: host 1's link down for ``--seconds``, then up again;
- ``slow_link``: host 1's link rate cut ``--slow-factor`` times, both ways, for ``--seconds``;
- ``none``: the same job uninterrupted (the AUC reference).

Reported per fault: the survivors' longest stall (seconds between two logged steps, against
their median), host 1's downtime and heal (seconds, bytes), steps redone, the step time
before/during/after a slowdown, the bytes that crossed host links per step, eval AUC against
the uninterrupted run, and whether the replicas ended bit-identical. tests/test_emulated_faults.py
runs the same faults and asserts what the issue asks.

Regenerate (root; ~6 min on 2 cores): .venv/bin/python bench/cluster_faults.py
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.bench_util import (  # noqa: E402
    RESULTS_DIR,
    machine_note,
    publish,
    stored_stamp,
)
from sparse2d.train.emulated_topology import link_bits  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LAUNCHER = ROOT / "launch" / "emulated_hosts.sh"
CLEANUP = ROOT / "launch" / "emulated_cleanup.sh"
MARKER = "cluster-faults"
LINK = "20mbit"
"""Each host's link. 20 Mbit/s, so that the 10x slowdown (2 Mbit/s) is felt: the tiny job's
sync moves ~55 KB a step across hosts, 22 ms at 20 Mbit/s and 0.22 s at 2 Mbit/s."""
TIMEOUT_S = 20
"""The fault job's ``fault_tolerance.timeout_s``: what a collective waits for a cut peer."""
JOB = (
    "model.tables=[{name: t, count: 2, rows: 400, dim: 16}]",
    "data.batch_size_per_rank=32",
    "train.log_every=5",
    "train.eval_batches=64",
    "train.progress_bar=false",
    f"fault_tolerance.timeout_s={TIMEOUT_S}",
    "fault_tolerance.quorum_timeout_s=60",
)
"""tests/test_ft_launch.py's one-host fault job (2 tables, batch 32, 64 eval batches: an
uninterrupted and a killed 1000-step run ended 0.0023-0.0029 of AUC apart there), logged every
5 steps for the stall figures."""
STEPS = 1500
FAULTS = ("none", "host_loss", "partition", "slow_link")


def cluster_name(*key: str) -> str:
    """A cluster's name (``CLUSTER_ID``) for ``key`` in this checkout: the same on every run,
    so a run's start removes what a killed run of the same key left (distinct checkouts on one
    machine get distinct names)."""
    return hashlib.sha1(":".join((str(ROOT), *key)).encode()).hexdigest()[:8]


def remove_cluster(name: str) -> None:
    """Everything of cluster ``name``, whatever its launcher's fate (a timeout SIGKILLs it and
    its trap never runs): ``launch/emulated_cleanup.sh NAME``, which fails naming what stays."""
    subprocess.run(["bash", str(CLEANUP), name], check=True, timeout=60)


def launch(
    run_dir: Path,
    steps: int = STEPS,
    *extra: str,
    hosts: int = 2,
    name: str = "",
    config: str = "configs/ft_tiny_cpu.yaml",
    job: tuple[str, ...] = JOB,
    restarts: int = 3,
) -> subprocess.Popen:
    """``FT=1 launch/emulated_hosts.sh`` with the fault job (``config`` with ``job``'s
    overrides), as cluster ``name`` (default: a random one), each host relaunched and each
    group restarted up to ``restarts`` times; its output goes to ``run_dir/launcher.log``
    (nobody reads a pipe while the faults run)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {
        k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "TORCHFT_LIGHTHOUSE")
    }
    env.update(
        PYTHON=sys.executable,
        FT="1",
        HOSTS=str(hosts),
        NPROC="2",
        LINK=LINK,
        CONFIG=config,
        MAX_RESTARTS=str(restarts),
        HOST_RESTARTS=str(restarts),
    )  # noqa
    if name:
        env["CLUSTER_ID"] = name
    log = open(run_dir / "launcher.log", "w")  # noqa: SIM115 (the child holds it)
    return subprocess.Popen(
        ["bash", str(LAUNCHER), *job, f"train.steps={steps}", f"run_dir={run_dir}", *extra],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def records(run_dir: Path, group: int, kind: str = "train") -> list[dict]:
    path = run_dir / f"replica_{group}" / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line being written
            continue
        if record.get("kind") == kind:
            out.append(record)
    return out


def wait_for_step(
    run_dir: Path, group: int, step: int, job: subprocess.Popen, timeout: float
) -> int:
    """Block until ``group`` logged a train step >= ``step``; return that step."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        steps = [r["step"] for r in records(run_dir, group)]
        if steps and steps[-1] >= step:
            return steps[-1]
        if job.poll() is not None:
            raise RuntimeError(
                f"the launch ended (rc {job.returncode}) before group {group} "
                f"reached step {step}:\n{tail(run_dir)}"
            )  # noqa
        time.sleep(0.2)
    raise RuntimeError(
        f"group {group} did not reach step {step} in {timeout:.0f} s:\n{tail(run_dir)}"
    )


def tail(run_dir: Path, lines: int = 40) -> str:
    text = ""
    for name in ("launcher.log", "host_1.log"):
        path = run_dir / name
        if path.exists():
            text += f"--- {name} ---\n" + "\n".join(path.read_text().splitlines()[-lines:]) + "\n"
    return text


def cluster(run_dir: Path) -> dict:
    return json.loads((run_dir / "cluster.json").read_text())


def namespace_pids(namespace: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
    return [int(p) for p in done.stdout.split()]


def lose_host(host: dict) -> int:
    """SIGKILL every process of the host (its launcher, torchrun agent and workers)."""
    pids = namespace_pids(host["namespace"])
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(pids)


def set_link(host: dict, up: bool) -> None:
    """The host's cable: its bridge-side veth down (both ends lose carrier) or up."""
    state = "up" if up else "down"
    subprocess.run(["ip", "link", "set", host["bridge_interface"], state], check=True)


def shape(host: dict, rate: str) -> None:
    """Both directions of the host's link to ``rate`` (as the emulator shapes them)."""
    bits = link_bits(rate)
    burst = max(bits // 8 // 100, 65536)
    qdisc = ["qdisc", "replace", "dev"]
    tail_ = ["root", "tbf", "rate", rate, "burst", str(burst), "latency", "50ms"]
    subprocess.run(["tc", *qdisc, host["bridge_interface"], *tail_], check=True)
    subprocess.run(["tc", "-n", host["namespace"], *qdisc, host["interface"], *tail_], check=True)


def run_fault(
    kind: str,
    run_dir: Path,
    *,
    at: int = 120,
    seconds: float = 30.0,
    slow_factor: int = 10,
    steps: int = STEPS,
    timeout: float = 900.0,
) -> dict:  # noqa
    """One launch with ``kind`` applied to host 1 once its group logged step >= ``at``;
    returns the raw figures (``analyse`` turns them into the reported ones)."""
    if kind not in FAULTS:
        raise ValueError(f"fault {kind!r}: choose one of {', '.join(FAULTS)}")
    name = cluster_name("cluster_faults", kind)
    job = launch(run_dir, steps, name=name)
    event: dict = {"kind": kind}
    try:
        if kind != "none":
            event["step"] = wait_for_step(run_dir, 1, at, job, timeout=300)
            host = cluster(run_dir)["hosts"][1]
            event["pids_before"] = {
                str(h["host"]): namespace_pids(h["namespace"]) for h in cluster(run_dir)["hosts"]
            }
            event["start"] = time.time()
            if kind == "host_loss":
                event["killed"] = lose_host(host)
            elif kind == "partition":
                set_link(host, up=False)
                time.sleep(seconds)
                set_link(host, up=True)
            else:
                shape(host, f"{link_bits(LINK) // slow_factor}bit")
                time.sleep(seconds)
                shape(host, LINK)
            event["end"] = time.time()
        job.wait(timeout=timeout)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGTERM)
            job.wait(timeout=60)
        remove_cluster(name)  # the launcher's own teardown, in case it never ran
    event["rc"] = job.returncode
    event["cluster_id"] = cluster(run_dir)["id"]
    event["tail"] = tail(run_dir) if job.returncode != 0 else ""
    for g in (0, 1):
        path = run_dir / f"replica_{g}" / "summary.json"
        event[f"g{g}"] = json.loads(path.read_text()) if path.exists() else None
        event[f"train{g}"] = [
            (r["time"], r["step"], r["participants"]) for r in records(run_dir, g)
        ]
        event[f"starts{g}"] = [
            (r["time"], r["restart"], r["pid"]) for r in records(run_dir, g, "start")
        ]
        event[f"failed{g}"] = [
            (r["time"], r["step"], r["participants"]) for r in records(run_dir, g, "failed_commit")
        ]
    return event


def _gaps(train: list, start: float, end: float) -> list[float]:
    """Seconds per step between consecutive logged steps whose later one falls in [start, end)."""
    out = []
    for (t0, s0, _), (t1, s1, _) in zip(train, train[1:]):
        if start <= t1 < end and s1 > s0:
            out.append((t1 - t0) / (s1 - s0))
    return out


def analyse(event: dict, reference: dict | None = None) -> dict:
    """The reported figures of one fault run (``run_fault``'s event)."""
    g0, g1, kind = event["g0"], event["g1"], event["kind"]
    out: dict = {"fault": kind, "rc": event["rc"], "fault_step": event.get("step")}
    if g0 is None or g1 is None:
        out["missing_summary"] = [g for g in (0, 1) if event[f"g{g}"] is None]
        return out
    if "ended" in g1:  # cut off until the others finished: it stopped, naming the finisher
        out.update(group1_ended=g1["ended"], group1_last_step=g1["final_step"])
        return out
    train0, train1 = event["train0"], event["train1"]
    steps0 = [s for _, s, _ in train0]
    out.update(
        identical=g0["state_digests"] == g1["state_digests"],
        eval_auc=g0["eval_auc"],
        final_steps=[g0["final_step"], g1["final_step"]],
        failed_commits=[g0["failed_commits"], g1["failed_commits"]],
        min_groups_in_step=[g0["min_groups_in_step"], g1["min_groups_in_step"]],
        restarts=[g0["restart_count"], g1["restart_count"]],
        steps_redone_group0=sum(a >= b for a, b in zip(steps0, steps0[1:])),
        host_link_bytes_per_step=g0["host_link_bytes_per_step"],
    )
    if reference is not None and reference.get("g0") is not None:
        out["reference_eval_auc"] = reference["g0"]["eval_auc"]
        out["auc_delta"] = g0["eval_auc"] - reference["g0"]["eval_auc"]
    if kind == "none":
        return out
    start, end = event["start"], event["end"]
    before = _gaps(train0, start - 20, start)
    normal = statistics.median(before) * 5 if before else 0.0  # a logged window: 5 steps
    after0 = [t for t, _, _ in train0 if t > start]
    longest = max((b - a for a, b in zip([start, *after0], after0)), default=0.0)
    out.update(
        survivor_pids_kept=set(g0["pids"]) <= set(event["pids_before"]["0"]),
        survivor_longest_gap_s=longest,
        survivor_normal_gap_s=normal,
        survivor_steps_alone=sum(1 for t, _, p in train0 if t > start and p == 1) * 5,
        # the fault as group 0 felt it: a step whose commit failed (a collective that timed
        # out on the lost peer), logged after the fault struck
        survivor_failed_commits=sum(1 for t, _, _ in event.get("failed0", []) if t >= start),
    )
    if kind == "partition":  # how group 0's stall ended: alone, or when the link was back
        out["survivor_alone_during_cut"] = any(start < t < end and p == 1 for t, _, p in train0)
        together = [t for t, _, p in train0 if t >= end and p == 2]
        out["survivor_back_after_link_s"] = together[0] - end if together else None
    relaunched = [t for t, restart, _ in event["starts1"] if t > start]  # a new launch's start
    since = relaunched[-1] if relaunched else start
    back = [t for t, _, p in train1 if t > since and p == 2]
    if back:
        out["group1_back_after_s"] = min(back) - start
    heals = [h for h in g1["heals"] if h["step"] > event["step"]]
    if heals:
        out["heal_s"], out["heal_bytes_per_rank"] = heals[-1]["seconds"], heals[-1]["bytes"]
        out["heal_from_group"] = heals[-1]["from_group"]
    if kind == "slow_link":
        during = _gaps(train0, start + 2, end)
        after = _gaps(train0, end + 3, end + 20)
        out.update(
            step_s_before=statistics.median(before) if before else None,
            step_s_during=statistics.median(during) if during else None,
            step_s_after=statistics.median(after) if after else None,
        )
    return out


def _f(value: object, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def markdown(results: dict, machine: str) -> str:
    rows = []
    for kind in FAULTS[1:]:
        r = results.get(kind)
        if r is None:
            continue
        detail = {
            "host_loss": f"host 1 back (rejoined) after {_f(r.get('group1_back_after_s'), '.1f')} s",
            "partition": f"link down {results['seconds']:.0f} s; host 1 back after "
            f"{_f(r.get('group1_back_after_s'), '.1f')} s",
            "slow_link": f"step {_f(r.get('step_s_before'), '.3f')} s before, "
            f"{_f(r.get('step_s_during'), '.3f')} s during, {_f(r.get('step_s_after'), '.3f')} s after",
        }[kind]
        rows.append(
            f"| {kind} (at step {r['fault_step']}) | {r['rc']} | {_f(r.get('survivor_longest_gap_s'), '.1f')} "
            f"(normal {_f(r.get('survivor_normal_gap_s'), '.2f')}) | {r.get('survivor_steps_alone', '-')} | "
            f"{r.get('steps_redone_group0', '-')} | {_f(r.get('heal_s'), '.3f')} / "
            f"{_f(r.get('heal_bytes_per_rank'), ',')} | {r.get('failed_commits')} | "
            f"{r.get('min_groups_in_step')} | {_f(r.get('auc_delta'), '+.4f')} | "
            f"{'yes' if r.get('identical') else 'NO'} | {detail} |"
        )
    ref = results.get("none", {})
    return "\n".join(
        [
            "### Faults on the emulated cluster (`bench/cluster_faults.py`)",
            "",
            f"`FT=1 launch/emulated_hosts.sh`: 2 hosts x 2 ranks, one fault-tolerant sharding group "
            f"per host, links {LINK} each way, the lighthouse on the bridge; the tiny fault job "
            f"(2 tables x 400 rows, batch 32 per rank, {results['steps']} steps, sync every step, "
            f"fault_tolerance.timeout_s=20). Each fault hits host 1 once its group logged step >= "
            f"{results['at']}. Uninterrupted: eval AUC {_f(ref.get('eval_auc'), '.4f')}, "
            f"{_f(ref.get('host_link_bytes_per_step'), ',.0f')} bytes per step across host links. "
            f"{machine}.",
            "",
            "| fault | launcher rc | group 0 longest gap, s (normal 5 steps) | group 0 steps alone | "
            "steps redone | heal s / bytes per rank | failed commits [g0, g1] | fewest groups in a step | "
            "eval AUC vs uninterrupted | replicas identical | host 1 |",
            "|---|---:|---:|---:|---:|---:|---|---|---:|---|---|",
            *rows,
            "",
            "Host loss: every process in host 1's namespace SIGKILLed (its launcher included); the "
            "emulator starts host 1's launch again as a scheduler would, and its group heals from "
            "group 0 over the link. Partition: host 1's bridge-side veth down, then up. Slow link: "
            f"host 1's tbf rate cut {results['slow_factor']}x both ways for {results['seconds']:.0f} s.",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--at", type=int, default=120)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--slow-factor", type=int, default=10)
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-results-md", action="store_true", help="do not edit RESULTS.md")
    parser.add_argument("--render", action="store_true", help="re-render the stored JSON")
    args = parser.parse_args()
    if args.render:
        stored = json.loads((args.out / "cluster_faults.json").read_text())
        events = stored["events"]
        results = {k: stored[k] for k in ("steps", "at", "seconds", "slow_factor", "link")}
        for kind, event in events.items():
            results[kind] = analyse(event, events.get("none"))
        results["events"] = events
        text = markdown(results, stored.get("machine", ""))
        publish(args, results, text, "cluster_faults.json", MARKER, stored_stamp(MARKER, args.out))
        return
    if os.geteuid() != 0:
        sys.exit("cluster_faults: needs root (network namespaces, tc), as launch/emulated_hosts.sh")
    load = os.getloadavg()[0]
    results: dict = {
        "machine": machine_note(load),
        "steps": args.steps,
        "at": args.at,
        "seconds": args.seconds,
        "slow_factor": args.slow_factor,
        "link": LINK,
    }
    events = {}
    with tempfile.TemporaryDirectory(prefix="cluster_faults_") as tmp:
        for kind in args.faults.split(","):
            events[kind] = run_fault(
                kind,
                Path(tmp) / kind,
                at=args.at,
                seconds=args.seconds,
                slow_factor=args.slow_factor,
                steps=args.steps,
            )
            print(kind, "rc", events[kind]["rc"], flush=True)
    for kind, event in events.items():
        results[kind] = analyse(event, events.get("none"))
    results["events"] = {
        k: {kk: vv for kk, vv in v.items() if kk != "tail"} for k, v in events.items()
    }
    publish(args, results, markdown(results, machine_note(load)), "cluster_faults.json", MARKER)


if __name__ == "__main__":
    main()
