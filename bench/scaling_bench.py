"""How 1D's and 2D's costs grow with the cluster: 2, 4 and 8 emulated hosts x 4 ranks.

Each cell is one training run on ``launch/emulated_hosts.sh`` (``cluster_bench.run_once``)
whose host links are time-dilated (``emulated_topology.dilated_link``: ``LINK x 2 / HOSTS``),
so every host's compute-to-link ratio is the 2-host cell's: the same cluster of identical
hosts, run ``HOSTS / 2`` times slower. Strategies: 1D (L = ranks), the shipped 2D layout
(sharding group inside a host: ``inter_host``, L = ranks per host) and full replication
(L = 1), sync as the config ships it. Workloads: ``fixed`` (the config's tables) and
``growing`` (its table count x HOSTS / 2). Rounds alternate the order (A B C, C B A, ...);
``--first-round`` continues a stored run's rounds with ``--merge`` (one held lock per call).

Per cell: samples/s (as measured and per dilated second), bytes crossing host links per step
per host (interface counters), the step split into replica sync (the trainer's
``sync_s_per_step``) and the rest (lookup all-to-all + compute: the trainer does not split
them; the model's split is shown beside), the model's embedding state per rank, the peak
RSS of the largest rank (``VmHWM`` of each rank's process), and the cost model's bytes and
step for the same cell (priced on the topology the emulator writes for it, no constant
refitted).

    sudo .venv/bin/python bench/scaling_bench.py                              # every cell
    sudo .venv/bin/python bench/scaling_bench.py --sizes 2 --strategies 1d,2d --merge
    .venv/bin/python bench/scaling_bench.py --render                          # from JSON
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
from pathlib import Path
from typing import Any

from bench_util import RESULTS_DIR, machine_note, publish, stored_stamp
from cluster_bench import Cell, Strategy, predicted_candidate, repo_path, run_once

from sparse2d.train.config import load_config
from sparse2d.train.emulated_topology import BASE_HOSTS, dilated_link, dilation, topology_yaml
from sparse2d.train.link_bytes import FRAME_HEADER_BYTES

ROOT = Path(__file__).resolve().parent.parent
NAME = "scaling_bench"
MARKER = "scaling-measured"
STRATEGIES = ("1d", "2d", "rep")
WORKLOADS = ("fixed", "growing")


def strategy(kind: str, hosts: int, nproc: int, every: int, engine: str) -> Strategy:
    """``1d``: L = every rank; ``2d``: the shipped layout (group inside a host, L = ranks per
    host); ``rep``: full replication (L = 1)."""
    size = {"1d": hosts * nproc, "2d": nproc, "rep": 1}[kind]
    return Strategy(size, "inter_host", every, engine)


def workload_overrides(config: str, workload: str, hosts: int) -> list[str]:
    """The dotted overrides of a workload at ``hosts``: none for ``fixed``; for ``growing``
    every table group's count times ``hosts / BASE_HOSTS`` (the 2-host cell is the config)."""
    if workload == "fixed":
        return []
    if workload != "growing":
        raise ValueError(f"workload {workload!r}: use one of {WORKLOADS}")
    if hosts % BASE_HOSTS:
        raise ValueError(f"the growing workload needs hosts a multiple of {BASE_HOSTS}")
    tables = load_config(str(ROOT / config)).model.tables
    return [f"model.tables.{i}.count={t.count * hosts // BASE_HOSTS}" for i, t in enumerate(tables)]


class PeakRss:
    """The largest ``VmHWM`` (peak resident set) among the trainer processes of one run:
    every process whose command line runs ``sparse2d.train`` with this ``run_dir=``, read
    from ``/proc`` each second while the run lasts (a rank's peak is kept by the kernel, so
    sampling misses nothing but a rank that exits between two reads)."""

    def __init__(self, run_dir: Path) -> None:
        self.tag = f"run_dir={run_dir}".encode()
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmd = f.read()
                    if self.tag not in cmd or b"sparse2d.train\0" not in cmd:
                        continue
                    if b"torch.distributed.run" in cmd:  # the launcher, not a rank
                        continue
                    with open(f"/proc/{pid}/status") as f:
                        for line in f:
                            if line.startswith("VmHWM:"):
                                self.peak = max(self.peak, int(line.split()[1]) * 1024)
                except OSError:
                    continue


def _cell_args(args: argparse.Namespace, cell: dict[str, Any]) -> argparse.Namespace:
    """``run_once``'s arguments for one cell: its workload's overrides after the user's."""
    return argparse.Namespace(
        config=args.config,
        steps=args.steps,
        timeout=args.timeout,
        set=[*args.set, *workload_overrides(str(args.config), cell["workload"], cell["hosts"])],
    )


def plan(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every cell of the run: size, then workload, then strategy."""
    out = []
    for hosts in args.sizes:
        link = dilated_link(args.link, hosts)
        for workload in args.workloads:
            for kind in args.strategies:
                s = strategy(kind, hosts, args.nproc, args.every, args.engine)
                out.append(
                    {
                        "hosts": hosts,
                        "nproc": args.nproc,
                        "link": link,
                        "base_link": args.link,
                        "dilation": dilation(hosts),
                        "workload": workload,
                        "kind": kind,
                        "strategy": s,
                        "label": s.label(hosts * args.nproc),
                        "steps": args.steps,
                        "runs": [],
                    }
                )
    return out


def measure_one(args: argparse.Namespace, cell: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """One launch of ``cell``: ``run_once``'s figures plus peak RSS and the model's bytes and
    step terms for the layout it trained in."""
    c = Cell(cell["hosts"], cell["nproc"], cell["link"], cell["strategy"])
    cell_args = _cell_args(args, cell)
    with PeakRss(run_dir) as rss:
        result = run_once(c, cell_args, run_dir)
    result["peak_rss_bytes"] = rss.peak or None
    if "error" in result:
        return result
    summary = json.loads((run_dir / "summary.json").read_text())
    result["global_batch_size"] = summary["global_batch_size"]
    result["sync_bytes_per_step"] = summary.get("sync_bytes_per_step")  # per rank, trainer's
    for field in ("host_link_packets_per_step", "host_link_landing_bytes"):
        result[field] = summary.get(field)  # summed over hosts; absent before landing counted
    candidate = predicted_candidate(c, cell_args, run_dir, result)
    if candidate is not None:
        result["predicted"] = as_predicted(candidate, cell["strategy"].every)
    return result


def as_predicted(candidate: Any, every: int) -> dict[str, Any]:
    """The stored figures of the model's ``Candidate`` for a cell."""
    return {
        "step_s": candidate.step_s,
        "terms": dict(candidate.terms),
        "host_link_bytes": candidate.host_link_bytes,
        "host_link_terms": dict(candidate.host_link_terms),
        "state_per_rank_bytes": candidate.state_per_rank_bytes,
        "sync_bytes_per_step": candidate.sync_bytes / every,
        "sync_kind": candidate.sync_kind,
    }


def repredict(result: dict[str, Any]) -> None:
    """Every stored run's ``predicted`` again, by today's model on the topology the emulator
    writes for its cell (``emulated_topology.topology_yaml``): a change of the model checked
    on the measurements already made, without measuring again."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        for raw in stored_cells(result):
            c = Cell(raw["hosts"], raw["nproc"], raw["link"], raw["strategy"])
            run_dir = Path(folder) / f"{c.hosts}x{c.nproc}_{raw['workload']}_{raw['kind']}"
            run_dir.mkdir()
            (run_dir / "topology.yaml").write_text(topology_yaml(c.hosts, c.nproc, c.link))
            args = argparse.Namespace(
                config=result["config"],
                set=[
                    *result.get("overrides", []),
                    *workload_overrides(result["config"], raw["workload"], raw["hosts"]),
                ],
            )
            for run in _runs(raw):
                candidate = predicted_candidate(c, args, run_dir, run)
                if candidate is not None:
                    run["predicted"] = as_predicted(candidate, c.strategy.every)


def measure(args: argparse.Namespace, cells: list[dict[str, Any]]) -> None:
    """Rounds ``first_round`` .. ``first_round + rounds - 1``, odd rounds in reverse order."""
    scratch = Path(args.scratch)
    for r in range(args.first_round, args.first_round + args.rounds):
        order = cells if r % 2 == 0 else cells[::-1]
        for i, cell in enumerate(order):
            run_dir = scratch / f"r{r}_c{cells.index(cell)}"
            result = measure_one(args, cell, run_dir)
            result["round"] = r
            cell["runs"].append(result)
            shown = result.get("error") or (
                f"{result['samples_per_s']:.0f} samples/s, "
                f"{(result.get('host_link_bytes_per_step') or 0) / cell['hosts'] / 1e6:.2f} "
                f"MB/host/step, peak RSS {(result['peak_rss_bytes'] or 0) / 2**20:.0f} MiB"
            )
            print(
                f"[round {r} {i + 1}/{len(cells)}] {cell['hosts']}x{cell['nproc']} "
                f"{cell['link']} {cell['workload']} {cell['label']}: {shown}",
                flush=True,
            )


def key(cell: dict[str, Any]) -> tuple[int, str, str]:
    return cell["hosts"], cell["workload"], cell["kind"]


def stored_cells(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The stored JSON's cells with their strategies as ``Strategy`` again."""
    for cell in result["cells"]:
        if isinstance(cell["strategy"], dict):
            cell["strategy"] = Strategy.from_stored(cell["strategy"])
    return result["cells"]


def as_json(cell: dict[str, Any]) -> dict[str, Any]:
    from dataclasses import asdict

    return {**cell, "strategy": asdict(cell["strategy"])}


# -- figures of a cell ------------------------------------------------------------------


def _runs(cell: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in cell["runs"] if "error" not in r]


def mean(cell: dict[str, Any], field: str) -> float | None:
    values = [r[field] for r in _runs(cell) if r.get(field) is not None]
    return statistics.fmean(values) if values else None


def predicted(cell: dict[str, Any], *path: str) -> float | None:
    """A predicted figure (the same for every run of a cell: its first)."""
    for run in _runs(cell):
        value: Any = run.get("predicted")
        for part in path:
            value = None if value is None else value.get(part)
        if value is not None:
            return float(value)
    return None


def counted_syncs(steps: int, every: int) -> float:
    """The share of a run's replica syncs (one per ``every`` steps in steady state) whose
    bytes and wait fall inside the trainer's counting window: the sync started at the last
    step lands after the trainer stops counting (it is hidden behind a next step that never
    comes), so ``floor((steps - 1) / every)`` of ``steps / every`` count (1 of 2 at 40 steps
    and every 20; 4 of 5 at 100)."""
    return (steps - 1) // every / (steps / every)


def lands_counted(cell: dict[str, Any]) -> bool:
    """Whether every run of ``cell`` counted the bytes of the sync started at its last step
    (the trainer lands it while counting and reports ``host_link_landing_bytes``; runs
    before that did not)."""
    runs = _runs(cell)
    return bool(runs) and all(r.get("host_link_landing_bytes") is not None for r in runs)


def figures(cell: dict[str, Any]) -> dict[str, float | None]:
    """Per cell: measured samples/s, per dilated second and per rank per dilated second;
    bytes per host per step measured and predicted; step, sync and the rest, measured and
    predicted. The model's step is compared as the run timed it (``counted_syncs``: no step
    waits for the last step's sync); its bytes so too where the run did not count that sync
    (``lands_counted``), else at the model's steady state. ``steady_*`` are the model's own
    per-step figures; ``framing_per_host``: the counted packets' headers."""
    every = (
        cell["strategy"]["every"] if isinstance(cell["strategy"], dict) else cell["strategy"].every
    )
    uncounted = 1.0 - counted_syncs(cell["steps"], every)
    bytes_uncounted = 0.0 if lands_counted(cell) else uncounted
    sync_bytes = predicted(cell, "host_link_terms", "sync") or 0.0
    sync_s = predicted(cell, "terms", "sync") or 0.0
    steady_bytes, steady_step = predicted(cell, "host_link_bytes"), predicted(cell, "step_s")
    sps, step = mean(cell, "samples_per_s"), mean(cell, "step_s")
    nbytes = mean(cell, "host_link_bytes_per_step")
    packets = mean(cell, "host_link_packets_per_step")
    world = cell["hosts"] * cell["nproc"]
    dilated = None if sps is None else sps * cell["dilation"]
    terms = ("compute", "output_a2a", "input_a2a", "dense_allreduce", "overhead")
    rest = [predicted(cell, "terms", t) for t in terms]
    return {
        "samples_per_s": sps,
        "dilated_samples_per_s": dilated,
        "dilated_per_rank": None if dilated is None else dilated / world,
        "bytes_per_host": None if nbytes is None else nbytes / cell["hosts"],
        "predicted_bytes_per_host": None
        if steady_bytes is None
        else steady_bytes - bytes_uncounted * sync_bytes,
        "framing_per_host": None
        if packets is None
        else packets * FRAME_HEADER_BYTES / cell["hosts"],
        "steady_bytes_per_host": steady_bytes,
        "step_s": step,
        "predicted_step_s": None if steady_step is None else steady_step - uncounted * sync_s,
        "steady_step_s": steady_step,
        "sync_s": mean(cell, "sync_s_per_step"),
        "predicted_sync_s": predicted(cell, "terms", "sync"),
        "predicted_a2a_s": sum(predicted(cell, "terms", t) or 0.0 for t in terms[1:3]),
        "predicted_compute_s": predicted(cell, "terms", "compute"),
        "predicted_rest_s": None if None in rest else sum(rest),  # type: ignore[arg-type]
        "state_per_rank_bytes": predicted(cell, "state_per_rank_bytes"),
        "peak_rss_bytes": mean(cell, "peak_rss_bytes"),
        "eval_auc": mean(cell, "eval_auc"),
        "sync_bytes": mean(cell, "sync_bytes_per_step"),
        "predicted_sync_bytes": predicted(cell, "sync_bytes_per_step"),
    }


def _f(value: float | None, spec: str, scale: float = 1.0) -> str:
    return "-" if value is None else format(value * scale, spec)


def _share(part: float | None, whole: float | None) -> float | None:
    return None if part is None or not whole else part / whole


def _err(measured: float | None, model: float | None) -> str:
    if measured is None or model is None or not measured:
        return "-"
    return f"{(model - measured) / measured:+.0%}"


def ring_factor(hosts: int) -> float:
    """Bytes per host of a bandwidth-optimal all-reduce over ``hosts`` hosts, per byte of its
    payload: ``2 (H-1) / H`` (1.0 at 2 hosts, 1.75 at 8); the least any exact all-reduce sends."""
    return 2 * (hosts - 1) / hosts


def acceptance(cells: list[dict[str, Any]]) -> list[str]:
    """The issue's acceptance figures from the measured cells alone; cells not measured are
    named, never filled in."""
    out = []
    fixed = [c for c in cells if c["workload"] == "fixed" and _runs(c)]
    for kind, name in (("2d", "2D (inter_host, L=4)"), ("1d", "1D")):
        series = sorted((c["hosts"], figures(c)) for c in fixed if c["kind"] == kind)
        if len(series) >= 2:
            first, last = series[0], series[-1]
            growth = last[1]["bytes_per_host"] / first[1]["bytes_per_host"]  # type: ignore[operator]
            model = last[1]["predicted_bytes_per_host"] / first[1]["predicted_bytes_per_host"]  # type: ignore[operator]
            verdict = bound = ""
            if kind == "2d":
                verdict = " (goal <= 1.2x: " + ("met" if growth <= 1.2 else "**not met**") + ")"
                per = [f["bytes_per_host"] / ring_factor(h) for h, f in (first, last)]  # type: ignore[operator]
                bound = (
                    f" The goal cannot hold for an exact all-reduce: a bandwidth-optimal one "
                    f"sends 2(H-1)/H x its payload per host ({ring_factor(first[0]):.2f} at "
                    f"{first[0]} hosts, {ring_factor(last[0]):.2f} at {last[0]}). Per unit of "
                    f"that bound: {per[0] / 1e6:.2f} and {per[1] / 1e6:.2f} MB/host/step, "
                    f"{per[1] / per[0]:.2f}x ("
                    + ("flat within 1.2x" if per[1] / per[0] <= 1.2 else "**not flat**")
                    + ")."
                )
            out.append(
                f"- {name}, fixed workload: bytes per host per step grow {growth:.2f}x from "
                f"{first[0]} to {last[0]} hosts"
                f"{verdict}; the model says {model:.2f}x.{bound}"
            )
    bad_bytes, bad_step, priced = [], [], 0
    for c in cells:
        f = figures(c)
        if f["bytes_per_host"] is None or f["predicted_bytes_per_host"] is None:
            continue
        priced += 1
        name = f"{c['hosts']}x{c['nproc']} {c['workload']} {c['label']}"
        b = abs(f["predicted_bytes_per_host"] - f["bytes_per_host"]) / f["bytes_per_host"]
        s = abs(f["predicted_step_s"] - f["step_s"]) / f["step_s"]  # type: ignore[operator]
        if b > 0.10:
            bad_bytes.append(f"{name} ({b:.0%})")
        if s > 0.30:
            bad_step.append(f"{name} ({s:.0%})")
    if priced:
        out.append(
            f"- Predicted bytes within 10% of the counters: {priced - len(bad_bytes)} of "
            f"{priced} cells" + (f"; off: {', '.join(bad_bytes)}" if bad_bytes else "") + "."
        )
        out.append(
            f"- Predicted step within 30%: {priced - len(bad_step)} of {priced} cells"
            + (f"; off: {', '.join(bad_step)}" if bad_step else "")
            + ". No constant was refitted on these cells (held out)."
        )
    largest = max((c["hosts"] for c in fixed), default=None)
    if largest is not None:
        by = {c["kind"]: figures(c) for c in fixed if c["hosts"] == largest}
        if "1d" in by and "2d" in by:
            ratio = by["2d"]["samples_per_s"] / by["1d"]["samples_per_s"]  # type: ignore[operator]
            auc_2d, auc_1d = by["2d"]["eval_auc"], by["1d"]["eval_auc"]
            auc = (
                "eval AUC not recorded"
                if auc_2d is None or auc_1d is None
                else f"eval AUC {auc_2d:.4f} vs 1D's {auc_1d:.4f} at equal steps (goal >= "
                f"1D's - 0.005: {'met' if auc_2d >= auc_1d - 0.005 else '**not met**'})"
            )
            out.append(
                f"- Largest cluster measured ({largest} hosts): 2D is {ratio:.2f}x 1D's "
                f"samples/s (goal >= 2x: {'met' if ratio >= 2 else '**not met**'}); {auc}."
            )
    missing = [
        f"{c['hosts']}x{c['nproc']} {c['workload']} {c['label']}" for c in cells if not _runs(c)
    ]
    if missing:
        out.append(f"- Not measured (machine time): {', '.join(missing)}.")
    return out


def render(result: dict[str, Any]) -> str:
    """The RESULTS.md section: one table per workload, then the acceptance figures."""
    cells = stored_cells(result)
    for cell in cells:
        cell.setdefault("steps", result["steps"])
    lines = [
        "## Scaling, measured: 1D, 2D and full replication on 2 to 8 time-dilated emulated "
        "hosts (bench/scaling_bench.py)",
        "",
        f"Command: `sudo .venv/bin/python bench/scaling_bench.py` (pieces: `--sizes 2 "
        "--merge --first-round N`; `--render` re-renders; `--repredict` prices the stored "
        "cells again with the model of the day). "
        f"`{result['config']}`, {result['steps']} steps a run, rounds alternating in order; "
        f"{result['machine']}. Links dilated to {result['link']} x 2 / hosts (each host's "
        "share of the 2 cores falls as 2 / hosts: `sparse2d.train.emulated_topology.dilation`), "
        "so per dilated second = as measured x hosts / 2. MB/host: bytes crossing host links "
        "per step per host, interface counters (measured) and the cost model's "
        "`Candidate.host_link_bytes` (payload, no framing: the packets' headers, "
        "`link_bytes.FRAME_HEADER_BYTES` each, are the column headers %), as the run "
        "counted it: the trainer lands the sync started at the last step while counting "
        "(`host_link_landing_bytes`), so the model's steady state is compared; runs made "
        "before it did (the 1D cells, which have no sync, and cells not measured again) "
        "counted 1 of their 2 syncs, and the model's sync term is taken at the syncs counted "
        "(`counted_syncs`). The step is compared at the syncs counted in every run (no step "
        "waits for the last step's sync); [brackets]: the model's steady state. Step split: "
        "sync = the trainer's "
        "`sync_s_per_step` (the part of the sync the step waits for: a hidden sync overlaps "
        "the next steps; the stored runs predate the trainer counting a hidden sync's landing "
        "wait, which held the next lookup outside any sync call: their sync column leaves it "
        "out and their rest holds it: 2.1-3.0 s a sync of a 2x4 L=4 burst when measured "
        "again, from the next lookup, 20-120 ms after the sync starts, to its last ring's "
        "end) and `sync_bytes_per_step` (payload one rank sends per step, "
        "counted by the trainer) against the model's `sync_bytes` / every; rest = step - sync (lookup all-to-all + compute + dense "
        "all-reduce: the trainer does not split them), beside the model's a2a / compute terms. "
        "emb/rank: the model's embedding state of the most loaded rank (weights + optimizer); "
        "RSS: peak resident set of the largest rank; headers %: the counted packets' "
        "Ethernet/IP/TCP headers in the counters (`host_link_packets_per_step`, runs that "
        "counted packets). Predictions: the cost model on the "
        "topology the emulator writes for the cell, no constant refitted on these cells.",
        "",
    ]
    for workload in WORKLOADS:
        rows = [c for c in cells if c["workload"] == workload]
        if not rows:
            continue
        lines += [
            f"**Workload `{workload}`**"
            + (" (tables x hosts / 2)" if workload == "growing" else " (the config's tables)"),
            "",
            "| ranks | link | strategy | runs | samples/s | per dilated s | per rank per "
            "dilated s | MB/host/step meas. / model (err) | step ms meas. / model (err) | "
            "sync ms meas. / model | sync MB/rank/step trainer / model | rest ms meas. / model (a2a, compute) | emb/rank MB | "
            "peak RSS MiB | eval AUC | headers % |",
            "|---:|---|---|---:|---:|---:|---:|---|---|---|---|---|---:|---:|---:|---:|",
        ]
        for c in rows:
            f = figures(c)
            rest = None if f["step_s"] is None else f["step_s"] - (f["sync_s"] or 0.0)
            lines.append(
                f"| {c['hosts'] * c['nproc']} | {c['link']} | {c['label']} | {len(_runs(c))} | "
                f"{_f(f['samples_per_s'], '.0f')} | {_f(f['dilated_samples_per_s'], '.0f')} | "
                f"{_f(f['dilated_per_rank'], '.0f')} | "
                f"{_f(f['bytes_per_host'], '.2f', 1e-6)} / "
                f"{_f(f['predicted_bytes_per_host'], '.2f', 1e-6)} "
                f"({_err(f['bytes_per_host'], f['predicted_bytes_per_host'])}) "
                f"[{_f(f['steady_bytes_per_host'], '.2f', 1e-6)}] | "
                f"{_f(f['step_s'], '.0f', 1e3)} / {_f(f['predicted_step_s'], '.0f', 1e3)} "
                f"({_err(f['step_s'], f['predicted_step_s'])}) "
                f"[{_f(f['steady_step_s'], '.0f', 1e3)}] | "
                f"{_f(f['sync_s'], '.0f', 1e3)} / {_f(f['predicted_sync_s'], '.0f', 1e3)} | "
                f"{_f(f['sync_bytes'], '.2f', 1e-6)} / "
                f"{_f(f['predicted_sync_bytes'], '.2f', 1e-6)} | "
                f"{_f(rest, '.0f', 1e3)} / {_f(f['predicted_rest_s'], '.0f', 1e3)} "
                f"({_f(f['predicted_a2a_s'], '.0f', 1e3)}, "
                f"{_f(f['predicted_compute_s'], '.0f', 1e3)}) | "
                f"{_f(f['state_per_rank_bytes'], '.0f', 1e-6)} | "
                f"{_f(f['peak_rss_bytes'], '.0f', 2**-20)} | {_f(f['eval_auc'], '.4f')} | "
                f"{_f(_share(f['framing_per_host'], f['bytes_per_host']), '.1f', 100)} |"
            )
        errors = [(c["label"], r["error"]) for c in rows for r in c["runs"] if "error" in r]
        lines += [""] + [f"- {c} failed: {e}" for c, e in errors[:5]]
    lines += ["Acceptance figures (issue 65):", "", *acceptance(cells)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=Path("configs/cluster_cpu.yaml"))
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4, 8])
    parser.add_argument("--nproc", type=int, default=4, help="ranks per host")
    parser.add_argument("--link", default="200mbit", help="the 2-host cell's link rate")
    parser.add_argument("--workloads", type=lambda s: s.split(","), default=list(WORKLOADS))
    parser.add_argument("--strategies", type=lambda s: s.split(","), default=list(STRATEGIES))
    parser.add_argument("--every", type=int, default=20, help="parallel.sync.every")
    parser.add_argument("--engine", default="auto", help="parallel.sync.engine")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--first-round", type=int, default=0, help="continue stored rounds")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--scratch", default="/tmp/sparse2d-scaling-bench")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-results-md", action="store_true")
    parser.add_argument("--render", action="store_true", help="re-render the stored JSON")
    parser.add_argument(
        "--repredict", action="store_true", help="price the stored cells again, then render"
    )
    parser.add_argument("--merge", action="store_true", help="add to the stored JSON's cells")
    args = parser.parse_args(argv)
    for kind in args.strategies:
        if kind not in STRATEGIES:
            parser.error(f"--strategies: {kind!r} is not one of {STRATEGIES}")
    for workload in args.workloads:
        if workload not in WORKLOADS:
            parser.error(f"--workloads: {workload!r} is not one of {WORKLOADS}")
    stored = args.out / f"{NAME}.json"
    if args.render or args.repredict:
        result = json.loads(stored.read_text())
        stamp = stored_stamp(MARKER, args.out)
        if args.repredict:
            repredict(result)
            result["cells"] = [as_json(c) for c in result["cells"]]
    else:
        if os.geteuid() != 0:
            print("scaling_bench: needs root (launch/emulated_hosts.sh makes namespaces)")
            return 2
        load = os.getloadavg()[0]
        cells = plan(args)
        measure(args, cells)
        result = {
            "config": repo_path(args.config),
            "steps": args.steps,
            "link": args.link,
            "overrides": args.set,
            "machine": machine_note(load),
            "cells": [as_json(c) for c in cells],
        }
        stamp = None
        if args.merge and stored.exists():
            old = json.loads(stored.read_text())
            if (old["steps"], old["link"], old["config"]) != (
                result["steps"],
                result["link"],
                result["config"],
            ):
                print("scaling_bench: --merge needs the stored run's steps, link and config")
                return 2
            new = {key(c): c for c in result["cells"]}
            for c in old["cells"]:
                if key(c) in new and lands_counted(c) == lands_counted(new[key(c)]):
                    new[key(c)]["runs"] = c["runs"] + new[key(c)]["runs"]  # more rounds
                elif key(c) in new:  # counted another way: the new runs replace them
                    print(
                        f"scaling_bench: {key(c)}: stored runs counted the last sync "
                        "otherwise; replaced"
                    )
            kept = [c for c in old["cells"] if key(c) not in new]
            order = {k: i for i, k in enumerate(key(c) for c in plan_all(args))}
            result["cells"] = sorted(kept + result["cells"], key=lambda c: order.get(key(c), 0))
            result["machine"] = f"{old['machine']}; then {result['machine']}"
    args.out.mkdir(parents=True, exist_ok=True)
    publish(args, result, render(json.loads(json.dumps(result))), f"{NAME}.json", MARKER, stamp)
    return 0


def plan_all(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every cell of the full matrix, in the order the page lists them."""
    full = argparse.Namespace(**vars(args))
    full.sizes, full.workloads, full.strategies = [2, 4, 6, 8], list(WORKLOADS), list(STRATEGIES)
    return plan(full)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
