"""Module and function size: no file of ``sparse2d/`` over ~400 lines, no function over ~80
(issue 34), reached by moving concerns apart rather than cutting at a line count.

Every offender fails the test (none is excused).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 80


def offenders(root: Path = ROOT) -> dict[str, int]:
    """``path`` (file too long) or ``path:function`` (function too long) -> lines."""
    found: dict[str, int] = {}
    for path in sorted((root / "sparse2d").rglob("*.py")):
        name = path.relative_to(root).as_posix()
        source = path.read_text()
        lines = source.count("\n")
        if lines > MAX_FILE_LINES:
            found[name] = lines
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found[f"{name}:{node.name}"] = length
    return found


def test_no_module_or_function_over_the_size_limit() -> None:
    found = offenders()
    assert not found, (
        f"over {MAX_FILE_LINES} lines per file / {MAX_FUNCTION_LINES} per function: {found}; "
        "split by concern (one module per concern, small named steps)"
    )


def test_the_scan_sees_long_files_and_functions(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    module = tmp_path / "sparse2d" / "big.py"
    module.parent.mkdir()
    module.write_text(f"def long():\n{body}\n" + "\n" * MAX_FILE_LINES)
    assert offenders(tmp_path) == {
        "sparse2d/big.py": MAX_FUNCTION_LINES + 1 + MAX_FILE_LINES,
        "sparse2d/big.py:long": MAX_FUNCTION_LINES + 1,
    }
