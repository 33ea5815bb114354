"""What every patch module shares: the ``Patch`` record, the wrapper marker, the opt-outs.

A wrapper carries its upstream original under ``ORIGINAL``; ``apply()`` wraps only an
unmarked function, so applying twice wraps once, and a probe reads ``original_of`` so it
judges TorchRec's behaviour even after the patch is in place.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ORIGINAL = "_sparse2d_original"
OPTED_OUT: set[str] = set()
"""Names of the patches this process never applies (``sparse2d.patches.opt_out``)."""
IN_FORCE: set[str] = set()
"""Names of the process-wide patches applied so far (too late to opt out of)."""


@dataclass(frozen=True)
class Patch:
    """One workaround of upstream behaviour (one row of ``docs/patches.md``)."""

    name: str
    upstream: str
    """``file:line`` in the installed package (TorchRec 1.8.0, FBGEMM 1.8.0)."""
    issue: str
    """The upstream issue (URL), or ``none found`` with what was searched."""
    breaks: str
    """What goes wrong without the patch."""
    probe: str
    """What ``needed()`` checks on the installed version."""
    needed: Callable[[], bool]
    apply: Callable[[], Any]
    sites: tuple[str, ...] = ()
    """``module:attr.path`` of each upstream callable replaced (wrapped once when applied)."""
    trigger: str | None = None
    """None: ``apply_all`` applies it. Else where it is applied instead, and why."""
    devices: tuple[str, ...] | None = None
    """Device types whose models need it (``("cpu",)``: a CPU-only workaround, left out for
    a CUDA model); None: every device."""

    def applies_to(self, device_type: str) -> bool:
        """Whether a model on ``device_type`` needs it (its scope; the probe is separate)."""
        return self.devices is None or device_type in self.devices

    def wanted(self) -> bool:
        """Not opted out (``sparse2d.patches.opt_out``)."""
        return self.name not in OPTED_OUT

    def sites_present(self) -> bool:
        """Whether every upstream callable it replaces exists here. An older release may
        lack one (TorchRec 1.6 has no ``_zero_collision_hash``): the patch cannot apply."""
        try:
            for site in self.sites:
                resolve(site)
        except (ImportError, AttributeError):
            return False
        return True


def mark(wrapper: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    setattr(wrapper, ORIGINAL, original)
    return wrapper


def is_patched(fn: Any) -> bool:
    return hasattr(fn, ORIGINAL)


def original_of(fn: Any) -> Any:
    """The upstream callable under our wrapper (``fn`` itself when unpatched)."""
    return getattr(fn, ORIGINAL, fn)


def resolve(site: str) -> Any:
    """The object at ``module:attr.path`` (e.g. ``torchrec.distributed.comm:intra_and_cross_node_pg_2D``)."""
    module, _, path = site.partition(":")
    obj: Any = importlib.import_module(module)
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj
