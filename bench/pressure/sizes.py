"""Byte sizes as people write them: ``512MiB``, ``1.5GiB``, ``4GB`` (binary units, as the daemon's
flags), plain bytes, and sums or differences such as ``1MiB-128`` (the seed's payloads)."""

from __future__ import annotations

import math
import re

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

_UNITS = {"": 1, "B": 1, "K": KiB, "M": MiB, "G": GiB, "T": 1 << 40}
_TERM = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*", re.I)


def parse_size(text: str) -> int:
    """``"1MiB-128"`` → 1048448. Raises ValueError on anything else."""
    s = str(text).strip()
    if not s:
        raise ValueError("empty size")
    total, sign, pos = 0, 1, 0
    while True:
        m = _TERM.match(s, pos)
        if not m or m.end() == pos:
            raise ValueError(f"bad size {text!r}")
        n = float(m.group(1)) * _UNITS[m.group(2).upper()]
        total += sign * n
        pos = m.end()
        if pos == len(s):
            break
        if s[pos] not in "+-":
            raise ValueError(f"bad size {text!r}")
        sign = 1 if s[pos] == "+" else -1
        pos += 1
    if total <= 0 or total != math.floor(total):
        raise ValueError(f"size {text!r} is not a positive whole number of bytes")
    return int(total)


def format_size(n: int) -> str:
    """1048448 → ``"1MiB-128"``; 2684354560 → ``"2.5GiB"``; exact, short, parseable."""
    for unit, mult in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        q = n / mult
        if q >= 1 and q == int(q):
            return f"{int(q)}{unit}"
        if q >= 1 and (n * 4) % mult == 0:
            return f"{q:g}{unit}"
        near = round(q)
        if near >= 1 and mult > KiB and abs(n - near * mult) < KiB:
            return f"{near}{unit}{n - near * mult:+d}"
    return str(n)


def label_size(n: int) -> str:
    """Human label for charts and tables: ``1 MiB − 128 B`` style, short."""
    s = format_size(n)
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(GiB|MiB|KiB)([+-]\d+)?", s)
    if not m:
        return f"{n} B"
    out = f"{m.group(1)} {m.group(2)}"
    if m.group(3):
        d = int(m.group(3))
        out += f" {'−' if d < 0 else '+'} {abs(d)} B"
    return out


def approx_size(n: int) -> str:
    """``≈ 320 MiB`` for titles: three significant figures in the largest unit that fits."""
    for unit, mult in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= mult:
            q = n / mult
            s = f"{q:.3g}" if q < 100 else f"{q:.0f}"
            return ("" if q == float(s) else "≈ ") + f"{s} {unit}"
    return f"{n} B"
