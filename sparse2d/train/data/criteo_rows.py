"""Row checks for Criteo TSV files: bad rows are skipped, counted and reported, never fatal.

TorchRec's converter stops at the first broken line with a bare error; here each row is matched
against the Criteo schema with one compiled regex, and only a file with bad rows is rewritten
without them. A file with no usable row is an error naming it and its first problem.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field

from sparse2d.errors import ConfigError

INT_COLUMNS, CAT_COLUMNS = 13, 26
COLUMNS = 1 + INT_COLUMNS + CAT_COLUMNS
_ROW = re.compile(
    rb"[01]\t(?:-?[0-9]*\t){%d}(?:[0-9a-fA-F]*\t){%d}[0-9a-fA-F]*\r?\n?\Z"
    % (INT_COLUMNS, CAT_COLUMNS - 1)
)


def row_problem(line: bytes) -> tuple[str, str]:
    """(kind, detail) of the first schema violation of a row the regex rejected."""
    fields = line.rstrip(b"\r\n").split(b"\t")
    if len(fields) != COLUMNS:
        return "column count", f"{len(fields)} columns instead of {COLUMNS}"
    if fields[0] not in (b"0", b"1"):
        return "label", f"label {fields[0].decode(errors='replace')!r} is not 0 or 1"
    for i in range(1, 1 + INT_COLUMNS):
        if fields[i] and not re.fullmatch(rb"-?[0-9]+", fields[i]):
            value = fields[i].decode(errors="replace")
            return "integer", f"column {i} value {value!r} is not an integer"
    for i in range(1 + INT_COLUMNS, COLUMNS):
        if not re.fullmatch(rb"[0-9a-fA-F]*", fields[i]):
            value = fields[i].decode(errors="replace")
            return "categorical", f"column {i} value {value!r} is not hexadecimal"
    return "format", "not a Criteo row"


@dataclass(slots=True)
class RowReport:
    """What the check of one file found."""

    path: str
    rows: int = 0
    """Lines read."""
    skipped: Counter[str] = field(default_factory=Counter)
    """Skipped rows by kind of problem."""
    first: dict[str, str] = field(default_factory=dict)
    """The first skipped line of each kind: ``line N: detail``."""

    @property
    def kept(self) -> int:
        return self.rows - sum(self.skipped.values())

    def describe(self) -> str:
        parts = [f"{n} {kind} ({self.first[kind]})" for kind, n in self.skipped.most_common()]
        return (
            f"{self.path}: skipped {sum(self.skipped.values())} of {self.rows} rows: "
            + "; ".join(parts)
        )


def check_rows(path: str, cleaned: str) -> tuple[str, RowReport]:
    """Check every row of TSV ``path``; return the file to convert and the report.

    The file to convert is ``path`` itself when every row is good, else ``cleaned`` (written
    here, bad rows dropped). Raises ``ConfigError`` when no row is usable.
    """
    report = RowReport(path)
    bad_lines: set[int] = set()
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            report.rows += 1
            if _ROW.match(line):
                continue
            kind, detail = row_problem(line)
            report.skipped[kind] += 1
            report.first.setdefault(kind, f"line {number}: {detail}")
            bad_lines.add(number)
    if report.rows == 0 or report.kept == 0:
        why = "the file is empty" if report.rows == 0 else report.describe()
        raise ConfigError(
            f"data.criteo file {path!r} has no usable rows ({why}); give Criteo TSV rows: "
            f"label 0/1, {INT_COLUMNS} integers, {CAT_COLUMNS} hex categoricals, tab-separated."
        )
    if not bad_lines:
        return path, report
    tmp = f"{cleaned}.tmp{os.getpid()}"
    with open(path, "rb") as src, open(tmp, "wb") as dst:
        for number, line in enumerate(src, start=1):
            if number not in bad_lines:
                dst.write(line if line.endswith(b"\n") else line + b"\n")
    os.replace(tmp, cleaned)
    return cleaned, report
