"""Keep one GPU architecture's machine code in a shared library's CUDA fatbin.

FBGEMM's CUDA wheel (465 MB) carries cubins for sm_80, sm_90 and sm_100. A device machine
here takes 64 MiB per call, so ``bench/gpu/wheels.sh`` zeroes every other architecture's
cubin (the CUDA runtime reads only the entry for its own GPU) and the rest compresses to
~82 MB. Usage: ``python prune_fatbin.py LIB.so ARCH OUT.so`` (ARCH 90 for H100/H200).
"""

from __future__ import annotations

import collections
import struct
import sys
from collections.abc import Iterator

FATBIN_MAGIC = 0xBA55ED50


def sections(buf: bytes) -> dict[str, tuple[int, int]]:
    """ELF64 section name -> (file offset, size)."""
    (shoff,) = struct.unpack_from("<Q", buf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", buf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", buf, shoff + i * shentsize) for i in range(shnum)]
    names = headers[shstrndx][4]
    out = {}
    for h in headers:
        start = names + h[0]
        out[buf[start : buf.index(b"\0", start)].decode()] = (h[4], h[5])
    return out


def entries(buf: bytes, off: int, size: int) -> Iterator[tuple[int, int, int, int]]:
    """(kind, arch, payload offset, payload size) of every entry of every fatbin."""
    end = off + size
    while off < end:
        magic, _, header, fat_size = struct.unpack_from("<IHHQ", buf, off)
        if magic != FATBIN_MAGIC:
            off += 8  # padding between fatbins
            continue
        entry, fat_end = off + header, off + header + fat_size
        while entry < fat_end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", buf, entry)
            (arch,) = struct.unpack_from("<I", buf, entry + 28)
            yield kind, arch, entry + entry_header, payload
            entry += entry_header + payload
        off = fat_end


def prune(path: str, keep: int, out: str) -> dict[tuple[int, int], int]:
    buf = bytearray(open(path, "rb").read())
    found = sections(buf).get(".nv_fatbin")
    if found is None:
        raise SystemExit(f"{path}: no .nv_fatbin section")
    tally: collections.Counter[tuple[int, int]] = collections.Counter()
    for kind, arch, start, size in entries(buf, *found):
        tally[(kind, arch)] += size
        if arch != keep:
            buf[start : start + size] = bytes(size)
    if not tally.get((2, keep)):
        raise SystemExit(f"{path}: no sm_{keep} cubin; kept the file whole")
    open(out, "wb").write(buf)
    return dict(tally)


if __name__ == "__main__":
    print(prune(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
