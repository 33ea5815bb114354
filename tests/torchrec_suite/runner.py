"""Run TorchRec's own 2D sharding test cases (vendored, unchanged) in the shared gloo worlds.

TorchRec's ``test_2d_sharding.py`` needs 8 GPUs and NCCL, and every case spawns a fresh
pool of processes. Here the test classes are subclassed with only what the CPU world
needs changed: ``WORLD_SIZE``/``WORLD_SIZE_2D`` (the cases' own expressions then give
the sharding-group and node-group sizes), ``setUp``'s backend (gloo), and
``_run_multi_process_test``, which sends the case's callable and arguments to the ranks
of an already-joined ``tests.harness.DistWorld`` instead of a new process pool. There
the harness's ``sharding_single_rank_test`` body runs on ``dist.group.WORLD`` with its
module attribute ``DMPCollection`` swapped for ``sparse2d.DMPCollection`` (every model
build, the ``isinstance`` check before ``sync()``, TorchRec's asserts and tolerances are
TorchRec's).
"""

from __future__ import annotations

import functools
import os
import pickle
import sys
import time
import types
import unittest
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

VENDORED = Path(__file__).resolve().parent / "vendored"
PACKAGE = "torchrec.distributed.tests"
"""The vendored files' upstream package: the wheel omits it, and the files import each
other by that name (``test_2d_sharding`` imports ``...tests.test_sequence_model``)."""

RELEASES = {"1.8.": "v1_8", "1.9.": "v1_9"}
"""TorchRec release -> the vendored folder holding that release's ``test_2d_sharding.py``:
each runs against its own release's ``test_utils`` (PROVENANCE names the commits). The
``test_sequence_model.py`` it imports is one file for both (the same blob)."""
WORLD_SIZE = 4
WORLD_SIZE_2D = 2


def release_folder(version: str) -> Path | None:
    """The vendored folder for torchrec ``version`` (None: no release of ours matches)."""
    folder = next((f for prefix, f in RELEASES.items() if version.startswith(prefix)), None)
    return None if folder is None else VENDORED / folder


def install_vendored() -> None:
    """Make ``torchrec.distributed.tests`` the installed release's vendored files
    (idempotent, any process)."""
    if PACKAGE in sys.modules:
        return
    import torchrec.distributed

    folder = release_folder(torchrec.__version__)
    if folder is None:
        raise RuntimeError(
            f"no vendored TorchRec tests for torchrec {torchrec.__version__}; vendored: "
            f"{sorted(RELEASES)} (tests/torchrec_suite/vendored/PROVENANCE)"
        )
    package = types.ModuleType(PACKAGE)
    package.__path__ = [str(folder), str(VENDORED)]  # type: ignore[attr-defined]
    package.__file__ = str(VENDORED / "__init__.py")
    sys.modules[PACKAGE] = package
    torchrec.distributed.tests = package  # type: ignore[attr-defined]


def vendored_module() -> types.ModuleType:
    """TorchRec's ``test_2d_sharding`` module, imported from the vendored copy."""
    install_vendored()
    import importlib

    return importlib.import_module(f"{PACKAGE}.test_2d_sharding")


@contextmanager
def _torchrec_rank_context(world_size: int, local_size: int | None) -> Iterator[None]:
    """What ``MultiProcessContext`` sets around a case, minus creating the process group."""
    import torch

    saved = {k: os.environ.get(k) for k in ("LOCAL_WORLD_SIZE", "LOCAL_RANK")}
    os.environ["LOCAL_WORLD_SIZE"] = str(local_size or world_size)
    if local_size is not None:
        os.environ["LOCAL_RANK"] = str(int(os.environ["RANK"]) % local_size)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_case(payload: bytes, dmp: str = "sparse2d") -> float:
    """Worker side: run one case's ``sharding_single_rank_test`` body on this rank.

    ``dmp="sparse2d"`` swaps ``DMPCollection``; ``"sparse2d-no-sync"`` swaps in one whose
    ``sync()`` does nothing (which cases would notice a missing sync); ``"torchrec-1d"``
    drops the 2D arguments so the same body builds TorchRec's own
    ``DistributedModelParallel`` over the whole world (the 1D reference for failures that
    are TorchRec's); ``"torchrec-1d-unfixed"`` is that with TorchRec's own
    ``ReduceScatterV_Wait.backward`` put back in place of sparse2d's gloo fix
    (``sparse2d.patches``) for the run. Returns seconds.
    """
    install_vendored()
    import torch
    import torch.distributed as dist
    from torchrec.distributed.test_utils import test_sharding

    import sparse2d

    fn, kwargs = pickle.loads(payload)
    if fn is not test_sharding.sharding_single_rank_test:
        raise TypeError(f"only sharding_single_rank_test is dispatched, not {fn!r}")
    kwargs = dict(kwargs)
    kwargs.pop("backend")  # the world's: gloo
    if kwargs["world_size"] != dist.get_world_size():
        raise ValueError(
            f"case wants {kwargs['world_size']} ranks, world has {dist.get_world_size()}"
        )
    kwargs["rank"] = dist.get_rank()
    if dmp.startswith("torchrec-1d"):
        for key in ("world_size_2D", "node_group_size", "submodule_configs"):
            kwargs.pop(key, None)
        kwargs.pop("custom_all_reduce", None)
        kwargs.pop("use_inter_host_allreduce", None)
    elif dmp not in DMPS:
        raise ValueError(dmp)
    from torchrec.distributed import comm_ops

    from sparse2d.patches import apply_all

    apply_all()
    wait = comm_ops.ReduceScatterV_Wait
    fixed_backward = wait.__dict__["backward"]
    if dmp == "torchrec-1d-unfixed":
        wait.backward = staticmethod(getattr(wait.backward, "_sparse2d_original", wait.backward))
    meshes: list[Any] = []
    original = test_sharding.DMPCollection, test_sharding.DeviceMesh
    test_sharding.DMPCollection = (
        _no_sync_class() if dmp == "sparse2d-no-sync" else sparse2d.DMPCollection
    )
    test_sharding.DeviceMesh = _cpu_mesh(original[1], meshes)
    start = time.perf_counter()
    try:
        with _torchrec_rank_context(kwargs["world_size"], kwargs.get("local_size")):
            test_sharding.sharding_single_rank_test_single_process(
                pg=dist.group.WORLD, device=torch.device("cpu"), **kwargs
            )
    finally:
        test_sharding.DMPCollection, test_sharding.DeviceMesh = original
        wait.backward = fixed_backward
        _release_case_groups(meshes, one_d=dmp.startswith("torchrec-1d"))
    return time.perf_counter() - start


DMPS = ("sparse2d", "sparse2d-no-sync", "torchrec-1d", "torchrec-1d-unfixed")


@functools.cache
def _no_sync_class() -> type:
    import sparse2d

    class NoSyncDMPCollection(sparse2d.DMPCollection):
        """Never averages replicas: a case that passes with it cannot see a missing sync."""

        def sync(self, *args: Any, **kwargs: Any) -> None:
            return None

    return NoSyncDMPCollection


def _cpu_mesh(device_mesh: type, made: list[Any]) -> Callable[..., Any]:
    """``create_device_mesh_for_2D`` (the custom all-reduce hook's replica group) asks for
    a ``cuda`` mesh; the same mesh on ``cpu``, remembered so its groups are released."""

    def build(device_type: str, *args: Any, **kwargs: Any) -> Any:
        mesh = device_mesh("cpu", *args, **kwargs)
        made.append(mesh)
        return mesh

    return build


def _release_case_groups(meshes: list[Any], one_d: bool) -> None:
    """Destroy the groups a case made outside the model (TorchRec's pool process would
    exit): the hook's mesh, and for 1D DMP the TWRW node groups ``MultiProcessContext``
    destroys on exit. The model's own groups are released by the harness (``close()``)."""
    import torch.distributed as dist
    from torchrec.distributed import comm

    groups = [mesh.get_group(dim) for mesh in meshes for dim in mesh.mesh_dim_names]
    if one_d:
        groups += [g for g in (comm._INTRA_PG, comm._CROSS_PG) if g is not None]
        comm._INTRA_PG = comm._CROSS_PG = None
    for group in {id(g): g for g in groups}.values():
        if group is not dist.group.WORLD:
            dist.destroy_process_group(group)


GLOO_SHARED = "gloo (shared world)"
"""``self.backend`` for a case run past its own ``backend == "gloo"`` skip; the world is
gloo all the same (``run_case`` drops the backend argument)."""


def cpu_class(
    base: type[unittest.TestCase],
    run: Callable[[bytes], Any],
    world_size_2d: int = WORLD_SIZE_2D,
    past_gloo_skip: bool = False,
) -> type:
    """``base`` (a vendored TorchRec test class) at 4 ranks / groups of ``world_size_2d``
    on gloo, whose ``_run_multi_process_test`` hands the case to ``run`` (a shared world)."""

    def setUp(self: Any) -> None:  # noqa: N802 (unittest's name)
        if "backend" in base.setUp.__code__.co_varnames:
            super(cls, self).setUp(backend="gloo")
            if past_gloo_skip:
                self.backend = GLOO_SHARED
        else:
            super(cls, self).setUp()
        if not hasattr(self, "device"):
            import torch

            self.device = torch.device("cpu")

    def _run_multi_process_test(
        self: Any, *, callable: Any, world_size: int = 2, **kwargs: Any
    ) -> None:
        kwargs["world_size"] = world_size
        self.result = run(pickle.dumps((callable, kwargs)))

    cls = type(
        f"Cpu{base.__name__}",
        (base,),
        {
            "WORLD_SIZE": WORLD_SIZE,
            "WORLD_SIZE_2D": world_size_2d,
            "setUp": setUp,
            "_run_multi_process_test": _run_multi_process_test,
        },
    )
    return cls


def inner_test(cls: type, name: str) -> Callable[..., None]:
    """The body of a ``@given`` test without hypothesis (and past its CUDA ``skipIf``)."""
    fn = getattr(cls, name)
    return fn.hypothesis.inner_test
