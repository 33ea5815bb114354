"""bench/RESULTS.md is written by scripts only: every section sits between its markers and
names an existing bench/ script that writes that marker; no text outside the sections but
the file header (so no hand-written, unowned or superseded prose can sit in it)."""

from __future__ import annotations

import json
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


def test_section_titles_are_distinct() -> None:
    """A reader navigates by title: two sections with one title (five cluster runs once
    shared one) cannot be told apart or linked to."""
    titles = re.findall(r"^## (.+)$", (BENCH / "RESULTS.md").read_text(), re.M)
    repeated = sorted({t for t in titles if titles.count(t) > 1})
    assert not repeated, repeated


MACHINE_PATH = re.compile(r"(?<![\w.~])/(?:work|home|root|tmp|mnt|opt|Users|var)/\S*")


def test_no_absolute_machine_paths() -> None:
    """Paths are relative to the repository, in the file and in the stored results' fields
    it renders from (a config path, a log line)."""
    found = MACHINE_PATH.findall((BENCH / "RESULTS.md").read_text())
    assert not found, found[:5]
    for path in sorted((BENCH / "results").glob("*.json")):
        data = json.loads(path.read_text())
        rendered = [data.get("config")] if isinstance(data, dict) else []
        if path.name == "cuda_check.json":
            rendered += [
                t.get("final") or ""
                for s in data["sessions"]
                for r in s["runs"]
                for k, t in r.items()
                if k.startswith("train_")
            ]
        for value in filter(None, rendered):
            assert not MACHINE_PATH.search(value), (path.name, value)
