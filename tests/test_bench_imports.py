"""bench/ never imports tests/: a benchmark runs from the repository alone (tests may import
bench helpers, never the other way), as issue 66 item 3 asks."""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_no_bench_script_imports_tests() -> None:
    scripts = sorted(BENCH.rglob("*.py"))
    assert scripts
    offenders = {
        str(path.relative_to(BENCH.parent)): sorted(
            n for n in _imported(path) if n == "tests" or n.startswith("tests.")
        )
        for path in scripts
    }
    assert not {k: v for k, v in offenders.items() if v}


def test_the_check_sees_an_import_of_tests(tmp_path: Path) -> None:
    script = tmp_path / "bench_x.py"
    script.write_text(
        "def f():\n    from tests.models import build_model\n\nimport tests.harness\n"
    )
    assert _imported(script) == {"tests.models", "tests.harness"}
