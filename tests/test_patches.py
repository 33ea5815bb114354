"""``sparse2d.patches``: the registry of upstream workarounds.

Every probe must still say "needed" on the installed TorchRec/FBGEMM/torch: the release that
fixes one turns its probe False and this module names the patch to drop. The patches
themselves are checked end to end by the tests each module's docstring names.
"""

from __future__ import annotations

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
    first = patches.apply_all()
    sites = {s: resolve(s) for p in patches.PATCHES for s in p.sites}
    second = patches.apply_all()
    assert first == second == [p.name for p in patches.PATCHES if p.trigger is None and p.needed()]
    for patch in patches.PATCHES:
        if patch.trigger is not None:
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
