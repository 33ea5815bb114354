"""Package structure: no import circles, imports only go down the layers (``LAYERS``), and the
library never imports the application.

Every ``import``/``from ... import`` in ``sparse2d/`` counts, at module level or inside a
function (a lazy import is still a dependency), except those under ``if TYPE_CHECKING:``.
Importing ``a.b.c`` also runs ``a/__init__`` and ``a/b/__init__``, so those count too.
``test_no_hidden_import_cycles`` counts the ``TYPE_CHECKING`` imports and
``importlib.import_module("literal")`` calls as well: a circle they close is hidden from the
importer, not absent (the trainer's loop and its modes were one, issue 56 item 3).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "sparse2d"
# The application: the trainer package (its command-line front end, train/cli.py, included).
APPLICATION = ("sparse2d.train",)

LAYERS: dict[str, tuple[str, ...]] = {
    "ground": (
        "sparse2d.errors",
        "sparse2d.mesh",
        "sparse2d.option_conflicts",
        "sparse2d.validation",
        "sparse2d.comm_device",
        "sparse2d.environment",
        "sparse2d.known_warnings",
    ),
    "upstream": ("sparse2d.planner", "sparse2d.patches"),
    "sync": ("sparse2d.sync", "sparse2d.managed_collision"),
    "core": ("sparse2d.core",),
    "features": ("sparse2d.ft", "sparse2d.checkpoint", "sparse2d.advisor", "sparse2d.fake_world"),
    "public": ("sparse2d", "sparse2d.public_collection"),
    "app": APPLICATION,
}
"""The layers of ``/work/shared/DESIGN.md`` section 6, bottom up, and the packages (or
top-level modules) each holds: a module may import its own layer and the ones below, never
one above. A new package must be placed here."""


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported_by_name(node: ast.AST) -> str | None:
    """``importlib.import_module("a.b")`` (or ``import_module("a.b")``): ``a.b``."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func, arg = node.func, node.args[0]
    named = (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id == "import_module"
    )
    if named and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    return None


def _imported(tree: ast.AST, name: str, is_package: bool, hidden: bool = False) -> set[str]:
    """What ``tree`` imports; ``hidden``: with its ``TYPE_CHECKING`` imports and the
    modules it imports by a literal name through ``importlib``."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not hidden:
            for child in node.orelse:
                visit(child)
            return
        by_name = _imported_by_name(node) if hidden else None
        if by_name:
            found.add(by_name)
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph(root: Path = ROOT, hidden: bool = False) -> dict[str, set[str]]:
    """``module -> {sparse2d modules it imports, with their parent packages}`` (``hidden``:
    counting ``TYPE_CHECKING`` imports and ``importlib`` by literal name too)."""
    files = {module_name(p, root): p for p in (root / PACKAGE).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        edges: set[str] = set()
        for target in _imported(tree, name, path.name == "__init__.py", hidden):
            parts = target.split(".")
            for i in range(1, len(parts) + 1):  # the module and every parent package
                candidate = ".".join(parts[:i])
                if candidate in files and candidate != name:
                    edges.add(candidate)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as ``[a, b, ..., a]``, or None. Package ``__init__`` edges to the
    package's own children are not circles (a package may re-export its modules)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def own_child(parent: str, child: str) -> bool:
        return child.startswith(parent + ".")

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if own_child(nxt, node):  # a child importing its parent package: always runs first
                continue
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def is_application(name: str) -> bool:
    return any(name == app or name.startswith(app + ".") for app in APPLICATION)


def library_to_application(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted(
        (src, dst)
        for src, dsts in graph.items()
        if not is_application(src)
        for dst in dsts
        if is_application(dst)
    )


def test_no_import_cycles() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_no_hidden_import_cycles() -> None:
    """No circle closes through an import the interpreter skips (``TYPE_CHECKING``) or one it
    cannot see (``importlib`` by name): the modes take a plain state, never the loop."""
    cycle = find_cycle(import_graph(hidden=True))
    assert cycle is None, "hidden import circle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize(
    "files",
    [
        {
            "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import sparse2d.b\n",
            "b.py": "import sparse2d.a\n",
        },
        {
            "a.py": "import importlib\ndef f():\n    importlib.import_module('sparse2d.b')\n",
            "b.py": "import sparse2d.a\n",
        },
    ],
)
def test_the_hidden_check_catches_what_it_claims(tmp_path: Path, files: dict[str, str]) -> None:
    pkg = tmp_path / PACKAGE
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for rel, text in files.items():
        (pkg / rel).write_text(text)
    assert find_cycle(import_graph(tmp_path)) is None  # the plain check cannot see these
    assert find_cycle(import_graph(tmp_path, hidden=True)) is not None


def test_library_never_imports_the_application() -> None:
    pairs = library_to_application(import_graph())
    assert not pairs, "library modules import the application: " + ", ".join(
        f"{a} -> {b}" for a, b in pairs
    )


def test_layout_has_the_documented_packages() -> None:
    graph = import_graph()
    for name in (
        "sparse2d.core.collection",
        "sparse2d.mesh",
        "sparse2d.planner",
        "sparse2d.sync",
        "sparse2d.checkpoint",
        "sparse2d.patches",
        "sparse2d.train",
        "sparse2d.train.loop",
    ):
        assert name in graph, f"{name} is missing from the package layout"


def test_every_module_name_is_unique_and_the_build_lives_in_core() -> None:
    """A file name says what it is once (issue 56 item 4: ten names appeared twice, e.g.
    ``ft/in_world.py`` beside ``train/in_world.py``); ``__init__``/``__main__`` excepted."""
    seen: dict[str, list[str]] = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        if path.name not in ("__init__.py", "__main__.py"):
            seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    twins = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not twins, f"module names used twice: {twins}"
    top = {p.name for p in (ROOT / PACKAGE).glob("*.py")}
    for name in ("collection.py", "collection_setup.py", "contexts.py", "construction.py"):
        assert name not in top and (ROOT / PACKAGE / "core" / name).exists(), name


@pytest.mark.parametrize(
    ("files", "expect_cycle", "expect_pair"),
    [
        ({"a.py": "import sparse2d.b\n", "b.py": "from sparse2d import a\n"}, True, None),
        (
            {"a.py": "def f():\n    from sparse2d.b import x\n", "b.py": "import sparse2d.a\n"},
            True,
            None,
        ),
        (
            {
                "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import sparse2d.b\n",
                "b.py": "import sparse2d.a\n",
            },
            False,
            None,
        ),
        (
            {
                "lib.py": "from sparse2d.train.loop import Loop\n",
                "train/__init__.py": "",
                "train/loop.py": "import sparse2d.lib\n",
            },
            True,
            ("sparse2d.lib", "sparse2d.train"),
        ),
        (
            {
                "lib.py": "import os\n",
                "train/__init__.py": "",
                "train/loop.py": "import sparse2d.lib\n",
            },
            False,
            None,
        ),
    ],
)
def test_the_checks_catch_what_they_claim(
    tmp_path: Path, files: dict[str, str], expect_cycle: bool, expect_pair: tuple | None
) -> None:
    """The two checks fail on planted circles and library->application imports."""
    pkg = tmp_path / PACKAGE
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    graph = import_graph(tmp_path)
    assert (find_cycle(graph) is not None) == expect_cycle
    pairs = library_to_application(graph)
    if expect_pair:
        assert expect_pair in pairs
    else:
        assert not pairs


def layer_of(name: str, layers: dict[str, tuple[str, ...]] = LAYERS) -> int:
    """The index in ``layers`` of the longest unit (package or module) holding ``name``."""
    best, index = "", -1
    for i, units in enumerate(layers.values()):
        for unit in units:
            holds = name == unit or name.startswith(unit + ".")
            if holds and len(unit) > len(best):
                best, index = unit, i
    if index < 0:
        raise KeyError(f"{name} is in no layer of tests/test_imports.py LAYERS: place it")
    return index


def upward_imports(
    graph: dict[str, set[str]], layers: dict[str, tuple[str, ...]] = LAYERS
) -> list[tuple[str, str]]:
    """``(importer, imported)`` pairs where the imported module sits in a higher layer.
    Importing a module also runs its parent packages (``sparse2d/__init__`` for all):
    those are not counted, as they run first whoever imports."""
    return sorted(
        (src, dst)
        for src, dsts in graph.items()
        for dst in dsts
        if not src.startswith(dst + ".") and layer_of(dst, layers) > layer_of(src, layers)
    )


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between ``sparse2d``'s packages and top-level modules (the root
    ``sparse2d/__init__`` left out: every module runs it first)."""

    def unit(name: str) -> str:
        return ".".join(name.split(".")[:2])

    packages: dict[str, set[str]] = {}
    for src, dsts in graph.items():
        if src == PACKAGE:
            continue
        edges = packages.setdefault(unit(src), set())
        edges.update(unit(d) for d in dsts if d != PACKAGE and unit(d) != unit(src))
    return packages


def test_every_module_has_a_layer() -> None:
    for name in import_graph(hidden=True):
        layer_of(name)


def test_imports_only_go_down_the_layers() -> None:
    """DESIGN.md section 6: ground < upstream < sync < core < features < public < app. Counts
    the ``TYPE_CHECKING`` imports too: a type named from above is a dependency on it."""
    pairs = upward_imports(import_graph(hidden=True))
    assert not pairs, "imports into a higher layer: " + ", ".join(f"{a} -> {b}" for a, b in pairs)


def test_core_imports_nothing_from_the_advisor() -> None:
    """``"auto"`` is the advisor's ``pick_group_size``, resolved above the core
    (``sparse2d.public_collection``): the core model never knows the advisor's modules."""
    graph = import_graph(hidden=True)
    pairs = sorted(
        (src, dst)
        for src, dsts in graph.items()
        if src.startswith("sparse2d.core.") or src == "sparse2d.core"
        for dst in dsts
        if dst == "sparse2d.advisor" or dst.startswith("sparse2d.advisor.")
    )
    assert not pairs, "core imports the advisor: " + ", ".join(f"{a} -> {b}" for a, b in pairs)


def test_no_import_cycles_between_packages() -> None:
    cycle = find_cycle(package_graph(import_graph(hidden=True)))
    assert cycle is None, "import circle between packages: " + " -> ".join(cycle or [])


@pytest.mark.parametrize(
    ("files", "upward", "package_cycle"),
    [
        ({"low.py": "import sparse2d.high\n", "high.py": "import os\n"}, True, False),
        ({"low.py": "import os\n", "high.py": "import sparse2d.low\n"}, False, False),
        (
            {"low/__init__.py": "", "low/a.py": "import sparse2d.mid.b\n", "mid/__init__.py": ""}
            | {"mid/b.py": "import sparse2d.low.c\n", "low/c.py": "", "high.py": ""},
            False,
            True,
        ),
    ],
)
def test_the_layer_checks_catch_what_they_claim(
    tmp_path: Path, files: dict[str, str], upward: bool, package_cycle: bool
) -> None:
    """A planted upward import and a planted circle between two packages of one layer."""
    pkg = tmp_path / PACKAGE
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    layers = {"low": ("sparse2d.low", "sparse2d.mid"), "high": ("sparse2d", "sparse2d.high")}
    graph = import_graph(tmp_path)
    assert bool(upward_imports(graph, layers)) == upward
    assert (find_cycle(package_graph(graph)) is not None) == package_cycle
