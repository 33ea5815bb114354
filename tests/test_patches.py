"""``sparse2d.patches``: the registry of upstream workarounds.

Every probe must still say "needed" on the installed TorchRec/FBGEMM/torch: the release that
fixes one turns its probe False and this module names the patch to drop. The patches
themselves are checked end to end by the tests each module's docstring names.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sparse2d import patches
from sparse2d.patches._base import is_patched, original_of, resolve

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ("Upstream:", "Issue:", "Without it:", "Probe:")


def _module_of(patch: patches.Patch):
    return next(m for m in patches.MODULES if patch in m.PATCHES)


def test_every_version_set_names_each_patch_with_an_upstream_line() -> None:
    """Each row of ``RELEASES`` names known patches at ``file:line``; the installed set's
    lines exist in the installed packages."""
    import importlib.util

    names = {p.name for p in patches.PATCHES}
    for release, needed in patches.RELEASES.items():
        assert set(needed) <= names, f"RELEASES[{release!r}] names unknown patches"
        for name, where in needed.items():
            assert re.fullmatch(r".+:\w+", where), f"{release} {name}: {where!r} is not file:line"
    for name, where in patches.RELEASES.get(patches.installed_release(), {}).items():
        path, _, line = where.rpartition(":")
        if not line.isdigit():
            continue  # glibc: a function name, not a line of a Python package
        top = importlib.util.find_spec(path.split("/")[0])
        source = Path(top.origin).parent.parent / path
        assert len(source.read_text().splitlines()) >= int(line), f"{name}: no {where}"


@pytest.mark.parametrize("patch", patches.PATCHES, ids=lambda p: p.name)
def test_each_probe_answers_as_recorded_for_the_installed_versions(patch: patches.Patch) -> None:
    """``RELEASES`` says which patches the installed set needs; every probe must agree."""
    release = patches.installed_release()
    assert release in patches.RELEASES, (
        f"torchrec {release} has no row in sparse2d.patches.RELEASES: run every probe "
        "(python -m sparse2d.patches) and record which still say needed, at which file:line"
    )
    if patch.name == "torchrec_runtime_forwards" and torch.cuda.is_available():
        pytest.skip("TorchRec's CUDA default is right on a CUDA host")
    expected = patch.name in patches.RELEASES[release]
    assert patch.needed() == expected, (
        f"{patch.name}: on the installed set ({release}) its probe says needed={patch.needed()}"
        f", RELEASES[{release!r}] says {expected}; "
        + (
            f"the installed version no longer behaves as {patch.upstream} did: drop the patch "
            f"from RELEASES[{release!r}] (and {_module_of(patch).__name__} once no set needs it)"
            if expected
            else "the bug is back: record it in RELEASES"
        )
    )


def test_apply_all_is_idempotent_and_wraps_each_site_once() -> None:
    here = "cuda" if torch.cuda.is_available() else "cpu"
    first = patches.apply_all()
    sites = {s: resolve(s) for p in patches.PATCHES for s in p.sites}
    second = patches.apply_all()
    expected = [
        p.name
        for p in patches.PATCHES
        if p.trigger is None and p.applies_to(here) and p.wanted() and p.needed()
    ]
    assert first == second == expected
    for patch in patches.PATCHES:
        if patch.name not in expected:
            continue
        for site in patch.sites:
            current = resolve(site)
            assert current is sites[site], f"{site} was wrapped again"
            assert is_patched(current), f"{patch.name} left {site} unpatched"
            assert not is_patched(original_of(current)), f"{site} is wrapped twice"


def test_a_patch_whose_upstream_site_is_missing_is_skipped_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An older TorchRec lacks a patched callable (1.6 has no ``_zero_collision_hash``,
    seen on the first CUDA check): ``apply_all`` must not crash model construction."""
    calls: list[str] = []
    missing = patches.Patch(
        name="missing_site",
        upstream="torchrec/modules/hash_mc_modules.py:1",
        issue="none",
        breaks="nothing",
        probe="always needed",
        needed=lambda: calls.append("needed") or True,
        apply=lambda: calls.append("apply"),
        sites=("torchrec.modules.hash_mc_modules:HashZchManagedCollisionModule._absent",),
    )
    assert not missing.sites_present()
    assert all(p.sites_present() for p in patches.PATCHES)  # every site exists here
    monkeypatch.setattr(patches, "PATCHES", [missing])
    with caplog.at_level("WARNING", logger="sparse2d.patches"):
        assert patches.apply_all() == []
    assert calls == []
    assert "missing_site not applied" in caplog.text and "_absent" in caplog.text


def test_applied_patches_fix_what_their_probes_detect() -> None:
    """Each cheap probe, run on the patched callable instead of TorchRec's, passes."""
    from torchrec.distributed import embeddingbag
    from torchrec.distributed.train_pipeline import runtime_forwards, train_pipelines
    from torchrec.distributed.train_pipeline.pipeline_context import TrainPipelineContext
    from torchrec.sparse.jagged_tensor import KeyedTensor

    from sparse2d.patches.torchrec_distributed_utils import twcw_shape_missing

    patches.apply_all()
    shape = embeddingbag.create_global_tensor_shape_stride_from_metadata
    assert not twcw_shape_missing(shape)
    train_pipelines._wait_for_events(
        torch.empty(1), TrainPipelineContext(), torch.cpu.current_stream()
    )
    KeyedTensor(keys=["f"], length_per_key=[1], values=torch.zeros(1, 1)).record_stream(
        torch.cpu.current_stream()
    )
    forward = runtime_forwards.BaseForward("p", None, None, None, None)
    assert forward._device.type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_each_patch_module_documents_its_patches() -> None:
    assert {m.__name__.rsplit(".", 1)[1] for m in patches.MODULES} == {
        p.stem for p in (ROOT / "sparse2d" / "patches").glob("*.py") if not p.stem.startswith("_")
    }, "a module of sparse2d/patches/ is missing from the registry"
    for module in patches.MODULES:
        doc = module.__doc__ or ""
        for patch in module.PATCHES:
            for field in FIELDS:
                assert doc.count(field) >= len(module.PATCHES), f"{module.__name__}: no {field!r}"
            assert patch.upstream in doc, f"{module.__name__} does not name {patch.upstream}"
            for url in re.findall(r"https://\S+", patch.issue):
                assert url in doc, f"{module.__name__} does not cite {url}"
            assert patch.needed.__doc__ and patch.apply.__doc__, patch.name
            assert "idempotent" in patch.apply.__doc__, patch.name
        if any(p.trigger for p in module.PATCHES):
            assert "Trigger:" in doc, f"{module.__name__}: say where and why it is applied"


def test_docs_table_is_written_from_the_registry() -> None:
    page = (ROOT / "docs" / "patches.md").read_text()
    assert patches.table() in page, "docs/patches.md: paste `python -m sparse2d.patches`"
    assert "docs/patches.md" in (ROOT / "README.md").read_text()


GLIBC = """
import os
from sparse2d.patches import glibc_malloc as g
os.environ["MALLOC_MMAP_THRESHOLD_"] = "131072"
pinned = (g.needed(), g.apply())
del os.environ["MALLOC_MMAP_THRESHOLD_"]
print(pinned, g.needed(), g.apply(), g.apply())
"""


def test_glibc_threshold_is_pinned_once_unless_the_user_pinned_it() -> None:
    """In a fresh process: the user's own threshold wins; else ``mallopt`` runs once."""
    out = subprocess.run(
        [sys.executable, "-c", GLIBC], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\n")[-2]
    assert out == "(False, False) True True True", out


CPU_ONLY = {
    "torchrec_comm_ops",
    "torchrec_train_pipelines.cpu_streams",
    "torchrec_runtime_forwards",
    "torchrec_jagged_tensor",
    "torchrec_hash_mc_modules",
    "fbgemm_tbe_training",
    "glibc_malloc",
}
"""The workarounds of gloo, CPU streams, FBGEMM's CPU kernels and a CPU-only host's default."""


def test_cpu_only_workarounds_are_scoped_to_the_cpu() -> None:
    assert {p.name for p in patches.PATCHES if p.devices == ("cpu",)} == CPU_ONLY
    assert all(p.devices is None for p in patches.PATCHES if p.name not in CPU_ONLY)


def _fresh(script: str) -> dict:
    """``script`` run in a fresh process (patches are process-wide); its last line as JSON."""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().split("\n")[-1])


SCOPED = """
import json
from sparse2d import patches
from sparse2d.patches._base import is_patched, resolve

def patched(name):
    patch = next(p for p in patches.PATCHES if p.name == name)
    return all(is_patched(resolve(site)) for site in patch.sites)

cuda = patches.apply_all("cuda")
after_cuda = {p.name: patched(p.name) for p in patches.PATCHES if p.trigger is None}
cpu = patches.apply_all("cpu")
after_cpu = {p.name: patched(p.name) for p in patches.PATCHES if p.trigger is None}
print(json.dumps({"cuda": cuda, "after_cuda": after_cuda, "cpu": cpu, "after_cpu": after_cpu}))
"""


def test_a_cuda_model_leaves_the_cpu_only_patches_out() -> None:
    """``apply_all("cuda")`` patches only what every device needs; a CPU model built later in
    the same process adds the CPU-only ones."""
    out = _fresh(SCOPED)
    everywhere = [p.name for p in patches.PATCHES if p.trigger is None and p.devices is None]
    assert out["cuda"] == everywhere
    assert {n for n, done in out["after_cuda"].items() if done} == set(everywhere)
    needed = [p.name for p in patches.PATCHES if p.trigger is None and p.needed()]
    assert out["cpu"] == needed
    assert all(out["after_cpu"].values()), out["after_cpu"]


OPTED_OUT = """
import json
from sparse2d import patches
from sparse2d.patches import glibc_malloc
from sparse2d.patches._base import is_patched, resolve

errors = []
def refused(*names):
    try:
        patches.opt_out(*names)
    except (ValueError, RuntimeError) as error:
        errors.append(type(error).__name__)

patches.opt_out("torchrec_jagged_tensor", "torchrec_hash_mc_modules")
applied = patches.apply_all("cpu")
site = resolve("torchrec.sparse.jagged_tensor:KeyedTensor.record_stream")
left = not is_patched(site)
refused("no_such_patch")
refused("torchrec_comm")  # in force since apply_all: too late
glibc_malloc.apply()
refused("glibc_malloc")
patches.opt_in("torchrec_jagged_tensor")
again = patches.apply_all("cpu")
print(json.dumps({
    "applied": applied, "left": left, "errors": errors, "again": again,
    "wanted": {p.name: p.wanted() for p in patches.PATCHES},
}))
"""


def test_an_opted_out_patch_is_never_applied() -> None:
    out = _fresh(OPTED_OUT)
    scoped = [p.name for p in patches.PATCHES if p.trigger is None and p.needed()]
    out_ = ("torchrec_jagged_tensor", "torchrec_hash_mc_modules")
    assert out["applied"] == [n for n in scoped if n not in out_]
    assert out["left"], "the opted-out patch wrapped its site"
    assert out["errors"] == ["ConfigError", "RuntimeError", "RuntimeError"]
    # opted in again: the next model applies it; the other stays out
    assert out["again"] == [n for n in scoped if n != "torchrec_hash_mc_modules"]
    assert [n for n, wanted in out["wanted"].items() if not wanted] == ["torchrec_hash_mc_modules"]
