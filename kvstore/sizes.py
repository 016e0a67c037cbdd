"""Byte sizes in the configuration: whole bytes, binary units only, printed back exactly.

Accepted: an integer or a string of digits (bytes), or a number with one of the units ``B KiB MiB
GiB TiB PiB`` (any case, ``"1.5GiB"`` when it comes to whole bytes). Refused, each with a message
that says why: negatives, fractions of a byte, and decimal (SI) units such as ``"1GB"`` — read as
10**9 by some tools and as 2**30 by others, so kvstore takes neither reading.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Annotated

from pydantic import BeforeValidator, ByteSize, PlainSerializer

UNITS = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40, "pib": 1 << 50}
_SI = {"k", "kb", "m", "mb", "g", "gb", "t", "tb", "p", "pb", "e", "eb"}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]*)")
_HOW = "a size with a binary unit such as '512MiB'"


def parse_size(value: object) -> int:
    """``value`` in bytes. Raises ValueError saying what is wrong (pydantic names the field)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"not a size: give a number of bytes or {_HOW}")
    if isinstance(value, str):
        text = value.strip().lower()
        if text.startswith("-"):
            raise ValueError("negative sizes are not allowed")
        match = _SIZE.fullmatch(text)
        if match is None:
            raise ValueError(f"not a size: give a number of bytes or {_HOW}")
        number, unit = Fraction(match[1]), match[2] or "b"
        if unit in _SI:
            raise ValueError(
                f"{match[2].upper()!r} is a decimal (SI) unit, which kvstore does not take: use "
                "KiB, MiB, GiB, TiB or PiB (1GiB = 2**30 bytes)"
            )
        if unit not in UNITS:
            raise ValueError(f"unknown unit {match[2]!r}: use B, KiB, MiB, GiB, TiB or PiB")
        nbytes = number * UNITS[unit]
    else:
        nbytes = Fraction(value)
    if nbytes < 0:
        raise ValueError("negative sizes are not allowed")
    if nbytes.denominator != 1:
        raise ValueError(f"not a whole number of bytes: give an integer or {_HOW}")
    return int(nbytes)


def format_size(nbytes: int) -> str:
    """Exact and readable: the largest binary unit that divides ``nbytes``, e.g. ``'1536MiB'``;
    ``parse_size`` reads it back to the same number."""
    for name, unit in sorted(UNITS.items(), key=lambda kv: -kv[1]):
        if unit > 1 and nbytes and nbytes % unit == 0:
            return f"{nbytes // unit}{name[0].upper()}iB"
    return f"{nbytes}B"


#: A configuration field holding a byte size (a ``ByteSize``, so an ``int``); JSON shows it
#: with its unit (``kvstore config``).
Size = Annotated[
    ByteSize,
    BeforeValidator(parse_size),
    PlainSerializer(format_size, return_type=str, when_used="json"),
]

__all__ = ["UNITS", "Size", "format_size", "parse_size"]
