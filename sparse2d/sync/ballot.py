"""A ballot: named flags that every rank fills in and one SUM all-reduce totals.

Every vote of several flags is a ``Ballot`` (fault tolerance's control vector, commit vote and
echo; FULLY_SHARDED's votes; checkpoint load's). It encodes this rank's flags into a slot of
the carrier's dtype, travels in an all-reduce of its own (``start``, ``start_each``) or
appended to one sent anyway (``encode(out=...)``), and is read back once into a ``Tally``.
SUM because every carrier runs it (torchft averages; ``scale`` undoes that) and a sum answers
"some rank" (> 0), "every rank" (== ranks) and totals.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from sparse2d.comm_device import flag_device


class Meaning(enum.Enum):
    """How a flag's total over the ranks is read."""

    ANY = "any"
    """Some rank set it (``bool``)."""
    ALL = "all"
    """Every rank set it (``bool``)."""
    SUM = "sum"
    """The ranks' values added (``int``): a count of 0/1 flags, or small integers."""


@dataclass(frozen=True, slots=True)
class Flag:
    """One named entry of a ballot."""

    name: str
    meaning: Meaning = Meaning.ANY


class Ballot:
    """An ordered set of flags; encoded in that order, one number per flag (back to back for
    several copies: a carrier that votes once per policy)."""

    def __init__(self, *flags: Flag) -> None:
        self.flags = flags
        self.size = len(flags)
        self._index = {flag.name: i for i, flag in enumerate(flags)}
        if len(self._index) != self.size:
            raise RuntimeError(f"a ballot's flags must have distinct names: {flags}")

    def index(self, flag: Flag | str) -> int:
        """The flag's place in one copy of the encoded ballot."""
        return self._index[flag if isinstance(flag, str) else flag.name]

    def values(self, *marks: Mapping[str, float]) -> list[float]:
        """This rank's numbers, one copy per mapping (a flag missing from it is 0)."""
        for mark in marks:
            unknown = set(mark) - self._index.keys()
            if unknown:
                raise KeyError(f"not on this ballot: {sorted(unknown)}")
        return [float(mark.get(flag.name, 0)) for mark in marks for flag in self.flags]

    def encode(
        self,
        *marks: Mapping[str, float],
        dtype: torch.dtype = torch.int32,
        device: torch.device | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """This rank's flags as a tensor (a new one, or written into ``out``: the ballot's
        slot in a buffer another all-reduce sends, whose dtype and device it takes)."""
        if out is None:
            return torch.tensor(self.values(*marks), dtype=dtype, device=device)
        out.copy_(torch.tensor(self.values(*marks), dtype=out.dtype))
        return out

    def mark(self, slot: torch.Tensor, flag: Flag | str, copy: int = 0) -> None:
        """Set ``flag`` in an encoded slot (after encoding: a scan of the very buffer sent)."""
        slot[copy * self.size + self.index(flag)] = 1

    def start(
        self,
        marks: Mapping[str, float],
        pg: dist.ProcessGroup | None,
        *,
        device: torch.device | None = None,
        dtype: torch.dtype = torch.int32,
    ) -> Counting:
        """Carry the ballot by its own async SUM all-reduce over ``pg`` (None: the world).

        Collective over ``pg``: every rank calls it at the same point; ``Counting.wait``
        returns the totals."""
        return self.start_each([marks], pg, device=device, dtype=dtype)

    def start_each(
        self,
        marks: Sequence[Mapping[str, float]],
        pg: dist.ProcessGroup | None,
        *,
        device: torch.device | None = None,
        dtype: torch.dtype = torch.int32,
    ) -> Counting:
        """``start`` for one copy of the ballot per mapping, in the one all-reduce (a vote per
        buffer of a kernel: FULLY_SHARDED's "written"); ``Counting.wait_each`` reads them."""
        tensor = self.encode(*marks, dtype=dtype, device=device or flag_device(pg))
        work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=pg, async_op=True)
        return Counting(self, tensor, work, dist.get_world_size(pg), len(marks))

    def read(
        self, totals: torch.Tensor | Sequence[float], *, ranks: int, scale: float = 1.0
    ) -> Tally:
        """The reduced slot, read: ``ranks`` voted; ``scale`` turns what the carrier left
        into sums (its participants when it averaged)."""
        return self.read_each(totals, 1, ranks=ranks, scale=scale)[0]

    def read_each(
        self, totals: torch.Tensor | Sequence[float], copies: int, *, ranks: int, scale: float = 1.0
    ) -> list[Tally]:
        """``read`` for ``copies`` ballots back to back (one ``tolist`` for all of them)."""
        values = totals.tolist() if isinstance(totals, torch.Tensor) else list(totals)
        if len(values) != copies * self.size:
            raise RuntimeError(f"{len(values)} totals for {copies} ballot(s) of {self.size}")
        size = self.size
        return [Tally(self, values[i * size : (i + 1) * size], ranks, scale) for i in range(copies)]


class Tally:
    """A ballot's totals over ``ranks`` ranks; ``tally[flag]`` reads one by its meaning."""

    __slots__ = ("ballot", "ranks", "scale", "values")

    def __init__(self, ballot: Ballot, values: list[float], ranks: int, scale: float) -> None:
        self.ballot, self.values, self.ranks, self.scale = ballot, values, ranks, scale

    def __getitem__(self, flag: Flag | str) -> int:
        """``bool`` for ``ANY`` and ``ALL``, the (rounded) sum for ``SUM``."""
        i = self.ballot.index(flag)
        raw = self.values[i]
        meaning = self.ballot.flags[i].meaning
        if meaning is Meaning.ANY:  # scale > 0 keeps the sign: no rounding to lose a vote
            return raw > 0
        total = round(raw * self.scale)
        return total == self.ranks if meaning is Meaning.ALL else total


class Counting:
    """A ballot's own all-reduce in flight (``Ballot.start`` / ``Ballot.start_each``)."""

    def __init__(
        self, ballot: Ballot, tensor: torch.Tensor, work: dist.Work, ranks: int, copies: int = 1
    ) -> None:
        self._ballot, self._tensor, self._work, self._ranks = ballot, tensor, work, ranks
        self._copies = copies

    def wait(self) -> Tally:
        """Wait for the all-reduce and read the totals (raises what the collective raised)."""
        if self._copies != 1:
            raise RuntimeError(f"{self._copies} ballots in flight: read them with wait_each")
        return self.wait_each()[0]

    def wait_each(self) -> list[Tally]:
        """``wait`` for every copy started by ``Ballot.start_each``, in order."""
        self._work.wait()
        return self._ballot.read_each(self._tensor, self._copies, ranks=self._ranks)
