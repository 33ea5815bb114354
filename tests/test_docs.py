"""The README and docs/ pages: every relative link resolves, every runnable snippet runs.

A link is ``[text](target)`` outside code fences; ``target`` may be a file or directory
relative to the page, with an optional ``#anchor`` that must match a heading of the target
Markdown file (GitHub's slugs). A snippet marked runnable is a ```` ```python ```` fence on
the line right after ``<!-- runnable -->``; each runs in its own CPU process from the
repository root (forked from one that imported torch once: ``tests/snippet_runner.py``),
so what a reader copies works.
"""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT

MARKER = "<!-- runnable -->"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOPICS = (
    "for_torchrec_users",
    "sync_strategies",
    "checkpoints",
    "fully_sharded",
    "advisor",
    "reliability",
    "training",
    "benchmarks",
    "observability",
    "patches",
)
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


VENV_COMMANDS = ("sparse2d", "tensorboard", "torchrun")  # installed into .venv/bin by make


def bare_venv_commands(page: Path) -> list[str]:
    """Lines of ``page``'s code blocks that start a command only the venv has (``sparse2d
    report ...``): after the README's set-up they fail with "command not found"."""
    bad, fenced = [], False
    for line in page.read_text().split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced and line.split(" ", 1)[0] in VENV_COMMANDS:
            bad.append(line)
    return bad


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_venv_commands_are_written_with_their_path(page: Path) -> None:
    assert bare_venv_commands(page) == [], "write .venv/bin/<command> (README: set-up)"


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


@pytest.fixture(scope="module")
def snippet_runner() -> Iterator[subprocess.Popen]:
    """One interpreter that imports torch once and forks a fresh child per snippet."""
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
    runner = subprocess.Popen(
        [sys.executable, "-m", "tests.snippet_runner"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    yield runner
    runner.kill()
    runner.wait(timeout=30)


def _answer(runner: subprocess.Popen, timeout: float) -> dict:
    answers: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: answers.put(runner.stdout.readline()), daemon=True)
    reader.start()
    try:
        line = answers.get(timeout=timeout)
    except queue.Empty:
        runner.kill()
        raise AssertionError(f"snippet did not finish within {timeout}s") from None
    assert line, f"the snippet runner died (exit {runner.wait(timeout=30)})"
    return json.loads(line)


@pytest.mark.parametrize(
    "page,index", RUNNABLE, ids=[f"{p.relative_to(ROOT)}[{i}]" for p, i in RUNNABLE]
)
def test_runnable_snippet_runs(page: Path, index: int, snippet_runner, tmp_path) -> None:
    log = tmp_path / "snippet.log"
    request = {"code": snippets(page)[index], "log": str(log)}
    snippet_runner.stdin.write(json.dumps(request) + "\n")
    snippet_runner.stdin.flush()
    done = _answer(snippet_runner, timeout=300)
    assert done["returncode"] == 0, f"{page.name} snippet {index}:\n{log.read_text()[-3000:]}"


_TORCHRUN = re.compile(r"<!-- torchrun: (\S+) -->\n```python\n(.*?)\n```", re.S)


def test_the_torchrun_script_of_for_torchrec_users_runs_as_written(tmp_path) -> None:
    """docs/for_torchrec_users.md's script, saved under its name, started by the page's own
    torchrun line (its interpreter this one): each rank prints its line, stderr holds no
    upstream warning or log line, and the run trains (a learnable label: the loss drops)."""
    text = (ROOT / "docs" / "for_torchrec_users.md").read_text()
    ((name, script),) = _TORCHRUN.findall(text)
    (tmp_path / name).write_text(script + "\n")
    line = next(
        x for x in text.splitlines() if x.endswith(f" {name}") and "torch.distributed.run" in x
    )
    words = line.split()
    assert words[0] == "OMP_NUM_THREADS=1" and words[1] == ".venv/bin/python", line
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    for var in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    ):
        env.pop(var, None)
    run = subprocess.run(
        [sys.executable, *words[2:]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = sorted(run.stdout.splitlines())
    assert [x.split(" loss=")[0] for x in lines] == [
        "rank 0: L=1 replicas=2",
        "rank 1: L=1 replicas=2",
    ], run.stdout
    assert all(float(x.split("loss=")[1]) < 0.6 for x in lines), lines  # from ln 2 = 0.69
    assert run.stderr.strip() == "", run.stderr[-3000:]
