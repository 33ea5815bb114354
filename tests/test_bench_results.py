"""bench/RESULTS.md is written by scripts only: every section sits between its markers and
names an existing bench/ script that writes that marker; no text outside the sections but
the file header (so no hand-written, unowned or superseded prose can sit in it)."""

from __future__ import annotations

import re
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
SECTION = re.compile(r"<!-- ([\w-]+):begin -->\n(.*?)<!-- \1:end -->", re.S)


def _sections() -> tuple[list[tuple[str, str]], str]:
    text = (BENCH / "RESULTS.md").read_text()
    outside = SECTION.sub("", text)
    return [(m.group(1), m.group(2)) for m in SECTION.finditer(text)], outside


def test_every_section_names_the_script_that_writes_it() -> None:
    sections, _ = _sections()
    assert sections, "no marker sections in bench/RESULTS.md"
    for name, body in sections:
        scripts = set(re.findall(r"bench/(\w+\.py)", body))
        writers = [
            s for s in scripts if (BENCH / s).exists() and f'"{name}"' in (BENCH / s).read_text()
        ]
        assert writers, (
            f"section {name!r} names no bench/ script that writes marker {name!r} ({sorted(scripts)})"
        )


def test_no_text_outside_sections_but_the_header() -> None:
    text = (BENCH / "RESULTS.md").read_text()
    sections, outside = _sections()
    begins = re.findall(r"<!-- ([\w-]+):begin -->", text)
    ends = re.findall(r"<!-- ([\w-]+):end -->", text)
    assert begins == ends == [n for n, _ in sections], "unbalanced or nested markers"
    header = text[: text.index("<!--")]
    assert outside.strip() == header.strip(), (
        "text outside a section: " + outside.replace(header, "")[:300]
    )
    assert "uncommitted changes" not in text
