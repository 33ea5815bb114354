"""The public API: what ``sparse2d`` exports, where errors live, what the docs import.

``sparse2d.__all__`` is the public surface; every name resolves (most on first access, see
``sparse2d/__init__.py``), every error class is defined in ``sparse2d/errors.py`` and exported,
and the README/docs snippets import only public names, so a reader never copies an internal
path. ``import sparse2d`` stays cheap: no torch, TorchRec or torchft until a name needs them.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import subprocess
import sys

import pytest

import sparse2d
from sparse2d import errors
from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
APPLICATION = ("sparse2d.train", "sparse2d.train.cli")
_FENCE = re.compile(r"```python\n(.*?)\n```", re.S)
_FROM = re.compile(r"^\s*from\s+(sparse2d[\w.]*)\s+import\s+\(?([^)#\n]+)", re.M)
_ATTR = re.compile(r"(?<![\w.])sparse2d\.(\w+)")


def error_classes() -> dict[str, type[BaseException]]:
    return {
        name: obj
        for name, obj in vars(errors).items()
        if inspect.isclass(obj)
        and issubclass(obj, BaseException)
        and obj.__module__ == errors.__name__
    }


def test_every_public_name_resolves() -> None:
    names = sparse2d.__all__
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    missing = [n for n in names if getattr(sparse2d, n, None) is None]
    assert not missing, missing
    assert set(names) <= set(dir(sparse2d))
    for name in ("SyncOptions", "SyncReport", "FaultTolerance", "FTOptimizer", "FTOptions"):
        assert name in names, name  # what docs/sync_strategies.md and docs/fault_tolerance.md use
    assert callable(sparse2d.checkpoint.save) and callable(sparse2d.checkpoint.load)
    with pytest.raises(AttributeError, match="no attribute 'live_tensors'"):
        sparse2d.live_tensors  # noqa: B018


def test_a_retired_name_says_it_was_retired() -> None:
    """``from sparse2d import TrialOptions`` (the measured auto trial's) names the retirement
    and where the runs behind it are, not a bare "cannot import name"."""
    for name in ("TrialOptions", "TrialError", "measured_group_size"):
        with pytest.raises(ImportError, match=f"sparse2d.{name} was retired.*section auto"):
            exec(f"from sparse2d import {name}", {})
        assert name not in sparse2d.__all__


def test_lazy_names_come_from_the_library() -> None:
    """The lazy table is strings (``importlib``), which ``test_imports`` cannot see: check here
    that none points into the application and each name is defined where the table says."""
    for name, module in sparse2d._LAZY.items():
        assert not module.startswith(APPLICATION), (name, module)
        assert getattr(importlib.import_module(module), name) is getattr(sparse2d, name)


def test_every_error_is_in_errors_py_and_exported() -> None:
    classes = error_classes()
    assert set(errors.__all__) == set(classes)
    for name, cls in classes.items():
        assert name in sparse2d.__all__, f"{name} is not exported by sparse2d"
        assert getattr(sparse2d, name) is cls
        assert issubclass(cls, errors.Sparse2DError), name
    defined_elsewhere = []
    for path in sorted((ROOT / "sparse2d").rglob("*.py")):
        if path.name == "errors.py" and path.parent.name == "sparse2d":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and re.search(r"(Error|Exception)$", node.name):
                defined_elsewhere.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not defined_elsewhere, defined_elsewhere


def test_error_hierarchy() -> None:
    """Bad input stays a ValueError (callers catch that); a checkpoint error is not a config
    error (a damaged file is not a bad setting); run-time failures are RuntimeErrors."""
    e = errors
    for cls in (
        e.ConfigError,
        e.PlanError,
        e.StoredPlanError,
        e.NoFitError,
        e.UnsupportedOptimizerError,
        e.KeyValueError,
        e.NotARunError,
    ):
        assert issubclass(cls, e.ConfigError) and issubclass(cls, ValueError), cls
    for cls in (e.CheckpointError, e.CorruptCheckpointError):
        assert issubclass(cls, e.CheckpointError) and not issubclass(cls, e.ConfigError), cls
    for cls in (e.SyncError, e.FaultToleranceError, e.CollectiveCallError, e.ClosedError):
        assert issubclass(cls, RuntimeError) and not issubclass(cls, ValueError), cls
    assert e.KeyValueError("a.b", "=1 must be >= 2").key == "a.b"


def test_no_bare_value_error_raised() -> None:
    """A bad value raises a sparse2d error naming it; ``zch_insert`` mirrors FBGEMM's op."""
    allowed = {"zch_insert"}  # a drop-in for FBGEMM's zero_collision_hash (sparse2d.patches)
    found = []
    for path in sorted((ROOT / "sparse2d").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef) or func.name in allowed:
                continue
            for node in ast.walk(func):
                exc = node.exc if isinstance(node, ast.Raise) else None
                call = exc.func if isinstance(exc, ast.Call) else exc
                if isinstance(call, ast.Name) and call.id == "ValueError":
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} in {func.name}")
    assert not found, sorted(set(found))


def test_sync_package_exports_no_internals() -> None:
    import sparse2d.sync as sync

    assert sync.__all__ == []
    source = (ROOT / "sparse2d" / "sync" / "__init__.py").read_text()
    assert not [
        n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Import | ast.ImportFrom)
    ]


def _doc_imports() -> list[tuple[str, str, str]]:
    """``(page, module, name)`` for every ``from sparse2d... import name`` in a Python fence."""
    out = []
    for page in PAGES:
        for block in _FENCE.findall(page.read_text()):
            for module, names in _FROM.findall(block):
                for name in names.split(","):
                    name = name.split(" as ")[0].strip()
                    if name:
                        out.append((page.name, module, name))
    return out


def test_docs_import_only_public_names() -> None:
    """From ``sparse2d``: a name in ``__all__``. From the trainer (``sparse2d.train...``, the
    application): a public name defined there. From any other library module: a name in its
    package's ``__all__`` (``sparse2d.checkpoint``, ``sparse2d.ft``); internals never."""
    imports = _doc_imports()
    assert len(imports) >= 10, imports  # the parser found the snippets
    bad = []
    for page, module, name in imports:
        if module == "sparse2d":
            ok = name in sparse2d.__all__
        elif module.startswith(APPLICATION):
            obj = getattr(importlib.import_module(module), name, None)
            ok = obj is not None and not name.startswith("_")
        else:
            ok = name in getattr(importlib.import_module(module), "__all__", ())
        if not ok:
            bad.append(f"{page}: from {module} import {name}")
    assert not bad, bad
    attributes = {
        (page.name, attr)
        for page in PAGES
        for block in _FENCE.findall(page.read_text())
        for attr in _ATTR.findall(block)
    }
    application = {m.split(".")[1] for m in APPLICATION}  # ``from sparse2d.train.x import``
    bad = [(p, a) for p, a in attributes if a not in sparse2d.__all__ and a not in application]
    assert not bad, bad


def test_import_is_light() -> None:
    """``import sparse2d`` (and the options, errors and layout helpers) loads no torch: the
    config checker and launchers import it; TorchRec/torchft load when a model is built."""
    code = (
        "import sys, sparse2d\n"
        "from sparse2d import ConfigError, SyncOptions, SyncReport, FTOptions, rank_layout\n"
        "print(sorted(m for m in ('torch', 'torchrec', 'torchft', 'fbgemm_gpu') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
