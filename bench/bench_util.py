"""What every benchmark script shares: rendezvous, spawning ranks, stats, RESULTS.md sections."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from queue import Empty
from typing import Any

BENCH = Path(__file__).resolve().parent
RESULTS = str(BENCH / "RESULTS.md")
# What the scripts measured (JSON, plots; each section of RESULTS.md renders from one) and
# what calibration reads (earlier measured series), apart from the scripts themselves.
RESULTS_DIR = BENCH / "results"
INPUTS_DIR = BENCH / "inputs"


def results_md(out: str | os.PathLike[str]) -> Path:
    """The RESULTS.md a script writing its JSON under ``out`` updates: bench/RESULTS.md for
    bench/'s own folders, else ``out/RESULTS.md`` (a test's or a trial's scratch folder)."""
    out = Path(out).resolve()
    return Path(RESULTS) if out in (BENCH, RESULTS_DIR) else out / "RESULTS.md"


def stamps_dir(directory: str | os.PathLike[str]) -> Path:
    """Where ``environment.json`` lives for results under ``directory``: bench/results for
    bench/'s own folders (and bench/RESULTS.md), else ``directory`` itself."""
    directory = Path(directory).resolve()
    return RESULTS_DIR if directory in (BENCH, RESULTS_DIR) else directory


def rendezvous() -> str:
    """Where a spawned benchmark world meets: a fresh file for a ``FileStore``. A port picked
    here and bound later by rank 0 can be taken in between on a busy box; a file cannot."""
    return os.path.join(tempfile.mkdtemp(prefix="sparse2d-bench-"), "store")


def bench_environment() -> dict[str, Any]:
    """The environment stamp of a benchmark (``sparse2d.environment``): every bench here
    spawns gloo CPU ranks on this one host; each section's table gives its world sizes."""
    from sparse2d.environment import environment

    return environment(backend="gloo", device_type="cpu", hosts=1)


def write_section(
    text: str,
    marker: str,
    path: str | os.PathLike[str] = RESULTS,
    stamp: dict[str, Any] | None = None,
) -> None:
    """Replace the ``marker`` section of ``path`` (between its HTML comments), or append it.

    Re-running a benchmark therefore updates its own section and leaves the others alone.
    The section ends with the environment stamp (code and library versions behind the
    numbers), also kept in full, keyed by ``marker``, in ``environment.json`` (``stamps_dir``).
    """
    from sparse2d.environment import one_line

    stamp = bench_environment() if stamp is None else stamp
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    old = open(path).read() if os.path.exists(path) else "# Benchmark results\n"
    # The line names the commit only: a tree with changes is committed afterwards, so
    # "uncommitted changes" would go stale in the file; environment.json keeps git_dirty.
    line = one_line({**stamp, "git_dirty": False})
    block = f"{begin}\n{text.strip()}\n\n_Environment: {line}._\n{end}"
    if begin in old and end in old:
        new = old[: old.index(begin)] + block + old[old.index(end) + len(end) :]
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(new)
    record_environment(marker, os.path.dirname(os.path.abspath(path)), stamp)


def record_environment(
    marker: str, directory: str | os.PathLike[str], stamp: dict[str, Any]
) -> None:
    """Keep ``stamp`` as ``marker``'s entry of ``environment.json`` under ``stamps_dir(directory)``."""
    stamps = _stamps(directory)
    stamps[marker] = stamp
    with open(stamps_dir(directory) / "environment.json", "w") as f:
        json.dump(stamps, f, indent=1, sort_keys=True)


def machine_note(load_at_start: float) -> str:
    """How busy the machine was: absolute times mean little on a loaded 2-core box."""
    return (
        f"{os.cpu_count()} cores, 1-minute load average {load_at_start:.1f} at start and "
        f"{os.getloadavg()[0]:.1f} at end"
    )


def timed(args: Any, measure: Callable[..., Any], *measure_args: Any) -> tuple[Any, float]:
    """Run ``measure(*measure_args)``; return (its result, wall seconds). Records the
    machine's load around it in ``args.machine`` for the section's text."""
    start, load = time.perf_counter(), os.getloadavg()[0]
    result = measure(*measure_args)
    args.machine = machine_note(load)
    return result, time.perf_counter() - start


def stored_stamp(marker: str, directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """``marker``'s environment stamp as its measurement recorded it (``environment.json``):
    a section re-rendered from its JSON keeps the commit and versions that made its numbers."""
    return _stamps(directory).get(marker)


def _stamps(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Every marker's stamp in ``environment.json`` under ``stamps_dir(directory)`` ({} if none)."""
    path = stamps_dir(directory) / "environment.json"
    return json.loads(path.read_text()) if path.exists() else {}


def publish(
    args: Any,
    result: Any,
    markdown: str,
    json_name: str,
    marker: str,
    stamp: dict[str, Any] | None = None,
) -> None:
    """Write the raw ``result`` to ``args.out/json_name`` (its environment stamp to
    ``environment.json``, ``stamps_dir``), print the section and, unless ``--no-results-md``,
    replace the ``marker`` section of ``results_md(args.out)``. ``stamp``: the measurement's
    (a re-render, ``stored_stamp``); by default this process's environment."""
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / json_name).write_text(json.dumps(result, indent=1))
    print(markdown)
    stamp = bench_environment() if stamp is None else stamp
    if args.no_results_md:
        record_environment(marker, args.out, stamp)
    else:
        write_section(markdown, marker, results_md(args.out), stamp)


def meta_ebc(tables: int, rows: int, dim: int) -> Any:
    """``tables`` EmbeddingBag tables ``t{i}`` (feature ``f{i}``) of ``rows x dim`` on the meta
    device, with row-wise AdaGrad fused into the backward (lr 0.01)."""
    import torch
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec import EmbeddingBagCollection
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.optim import RowWiseAdagrad

    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name=f"t{i}", embedding_dim=dim, num_embeddings=rows, feature_names=[f"f{i}"]
            )
            for i in range(tables)
        ],
        device=torch.device("meta"),
    )
    _apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), {"lr": 0.01})
    return ebc


def rendezvous_env(rank: int, world: int, where: str) -> None:
    """The torchrun-style env a spawned benchmark rank needs (TorchRec reads the local ones),
    and ``where`` its world meets (``rendezvous``), for ``init_gloo``."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        SPARSE2D_BENCH_STORE=where,
    )


def init_gloo(timeout_s: float) -> None:
    """The rank's default gloo group, met at ``rendezvous_env``'s file (no port chosen)."""
    import datetime

    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method="file://" + os.environ["SPARSE2D_BENCH_STORE"],
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def _spawned(rank: int, world: int, where: str, fn: Any, args: tuple, queue: Any) -> None:
    import logging
    import warnings

    import torch
    import torch.distributed as dist

    rendezvous_env(rank, world, where)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)  # TorchRec logs every plan at WARNING
    torch.set_num_threads(1)
    init_gloo(900)
    result = fn(*args)
    if rank == 0:
        queue.put(result)
    dist.barrier()
    dist.destroy_process_group()


def spawn(world: int, fn: Any, *args: Any) -> Any:
    """Run ``fn(*args)`` on ``world`` fresh gloo ranks (loopback); return rank 0's result.

    ``fn`` must be importable (a module-level function) and run the same collectives on
    every rank. Used by benchmarks that need a clean process per measurement (peak RSS).
    """
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    where = rendezvous()
    procs = [
        ctx.Process(target=_spawned, args=(r, world, where, fn, args, queue)) for r in range(world)
    ]
    for proc in procs:
        proc.start()
    while True:  # a rank that dies must not leave the parent waiting forever
        try:
            result = queue.get(timeout=5)
            break
        except Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:
                    p.kill()
                raise RuntimeError("a benchmark rank failed (see its traceback above)") from None
    for proc in procs:
        proc.join()
        if proc.exitcode:
            raise RuntimeError(f"benchmark rank exited with code {proc.exitcode}")
    return result


def stats(values: list[float]) -> dict[str, float]:
    """min / median / max of repeated measurements."""
    ordered = sorted(values)
    return {"min": ordered[0], "median": ordered[len(ordered) // 2], "max": ordered[-1]}
