"""The README and docs/ pages: every relative link resolves, every runnable snippet runs.

A link is ``[text](target)`` outside code fences; ``target`` may be a file or directory
relative to the page, with an optional ``#anchor`` that must match a heading of the target
Markdown file (GitHub's slugs). A snippet marked runnable is a ```` ```python ```` fence on
the line right after ``<!-- runnable -->``; each runs in a fresh CPU process from the
repository root (single process, seconds), so what a reader copies works.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

MARKER = "<!-- runnable -->"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOPICS = ("for_torchrec_users", "sync_strategies", "checkpoints", "fully_sharded", "advisor",
          "reliability", "training", "benchmarks", "observability")  # fmt: skip
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
_SNIPPET = re.compile(re.escape(MARKER) + r"\n```python\n(.*?)\n```", re.S)


def _prose(text: str) -> str:
    """The text outside fenced code blocks and HTML comments (blanked, lines kept)."""
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    out, fenced = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            out.append("")
        else:
            out.append("" if fenced else line)
    return "\n".join(out)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(path.read_text()).split("\n"):
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            out.add(base if count == 0 else f"{base}-{count}")
    return out


def broken_links(page: Path) -> list[str]:
    bad = []
    for target in _LINK.findall(_prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no such file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    return bad


def snippets(page: Path) -> list[str]:
    return _SNIPPET.findall(page.read_text())


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_link_checker_catches_broken_links(tmp_path) -> None:
    (tmp_path / "a.md").write_text("# Title here\n## `x.y` (z)\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](a.md#title-here) [ok](a.md#xy-z) [ok](#own) ![img](a.md) [web](https://x.org/y)\n"
        "# Own\n[gone](b.md) [bad anchor](a.md#nope)\n"
        "```\n[in code](c.md)\n```\n<!-- [in comment](d.md) -->\n"
    )
    assert broken_links(page) == [
        f"b.md: no such file {tmp_path / 'b.md'}",
        "a.md#nope: no heading with anchor #nope in a.md",
    ]


def test_layout_readme_short_and_every_topic_page_runnable() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 200, f"README.md has {lines} lines; move details into docs/"
    for topic in TOPICS:
        page = ROOT / "docs" / f"{topic}.md"
        assert page.exists(), page
        assert snippets(page), f"{page.name} has no {MARKER} python snippet"
        assert f"docs/{topic}.md" in (ROOT / "README.md").read_text(), f"README misses {topic}"


RUNNABLE = [(page, i) for page in PAGES for i, _ in enumerate(snippets(page))]


@pytest.mark.parametrize(
    "page,index", RUNNABLE, ids=[f"{p.relative_to(ROOT)}[{i}]" for p, i in RUNNABLE]
)
def test_runnable_snippet_runs(page: Path, index: int) -> None:
    code = snippets(page)[index]
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    for var in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    ):
        env.pop(var, None)  # a snippet is a reader's fresh process, not a rank of ours
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, f"{page.name} snippet {index}:\n{done.stderr[-3000:]}"
