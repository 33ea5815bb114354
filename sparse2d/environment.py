"""The environment stamp: which code, libraries and machines produced a number.

A run's ``summary.json`` and start record, and every benchmark's results, carry the same
stamp, so a figure in ``bench/RESULTS.md`` or a run directory can be traced back to the
sparse2d commit and the torch / TorchRec / FBGEMM builds behind it. Versions are read from
the imported modules (what actually ran), not from package metadata.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def git_commit(path: str = PACKAGE_DIR) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the git checkout that holds ``path``'s package, or (None, None).

    Only a checkout whose top level is the package's parent counts: an installed copy that
    happens to sit inside some other repository must not borrow that repository's commit.
    """
    root = os.path.dirname(os.path.abspath(path))

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", root, *args], capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.SubprocessError):  # no git binary, a hung file system
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if top is None or os.path.realpath(top) != os.path.realpath(root):
        return None, None
    commit = git("rev-parse", "HEAD")
    if commit is None:  # a repository without commits yet
        return None, None
    status = git("status", "--porcelain", "--untracked-files=no")
    return commit, (bool(status) if status is not None else None)


def library_versions() -> dict[str, str | None]:
    """sparse2d, torch, TorchRec and FBGEMM versions as imported in this process."""
    import torch

    import sparse2d

    out: dict[str, str | None] = {"sparse2d": sparse2d.__version__, "torch": torch.__version__}
    for name, module in (("torchrec", "torchrec"), ("fbgemm_gpu", "fbgemm_gpu")):
        try:
            out[name] = getattr(__import__(module), "__version__", None)
        except ImportError:
            out[name] = None
    return out


def environment(
    backend: str | None = None,
    device_type: str | None = None,
    world_size: int | None = None,
    hosts: int | None = None,
) -> dict[str, Any]:
    """The stamp: versions, git commit (None outside a checkout) and the job's shape.

    Pure (no collective): the caller passes what it knows of the job, e.g. the trainer the
    number of distinct hostnames it gathered at start-up.
    """
    import platform

    commit, dirty = git_commit()
    return {
        **library_versions(),
        "python": platform.python_version(),
        "git_commit": commit,
        "git_dirty": dirty,
        "backend": backend,
        "device_type": device_type,
        "world_size": world_size,
        "hosts": hosts,
    }


def one_line(stamp: dict[str, Any]) -> str:
    """The stamp as one human line, e.g. for a results section."""
    commit = stamp.get("git_commit")
    code = f"sparse2d {stamp.get('sparse2d')}"
    if commit:
        code += f" (git {commit[:10]}{', uncommitted changes' if stamp.get('git_dirty') else ''})"
    parts = [code] + [f"{k} {stamp[k]}" for k in ("torch", "torchrec", "fbgemm_gpu") if stamp[k]]
    job = ", ".join(
        f"{k.replace('_', ' ')} {stamp[k]}"
        for k in ("backend", "device_type", "world_size", "hosts")
        if stamp.get(k) is not None
    )
    return ", ".join(parts) + (f"; {job}" if job else "")
