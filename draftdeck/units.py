"""How amounts are written for people, once for the pages and the CLI: sizes in binary units that say
so (MiB, not "MB"), and counts with the noun agreeing ("1 row", "2 rows")."""

from __future__ import annotations

BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
# Nouns whose plural is not noun + "s"; units the jobs report progress in are plain nouns.
IRREGULAR = {"byte": "bytes", "entry": "entries", "batch": "batches"}


def binary_size(n: int | float | None) -> str:
    """`n` bytes with a binary unit: "512 B", "1.5 KiB", "64.0 MiB"; "?" when unknown."""
    if n is None:
        return "?"
    size = float(n)
    for unit in BINARY_UNITS:
        if abs(size) < 1024 or unit == BINARY_UNITS[-1]:
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")  # the loop returns at the last unit


def short_count(n: int) -> str:
    """A large count in three figures: "8.19B", "209.7M", "153.6K", "512"."""
    for value, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= value:
            return f"{n / value:.2f}{suffix}" if suffix == "B" else f"{n / value:.1f}{suffix}"
    return str(n)


def parse_size(text: str) -> int:
    """Bytes of a size as people write it: "80GiB", "80 GiB", "80Gi" and "80G" are binary (2**30
    each), "80GB" decimal (10**9). Raises ValueError naming what it accepts."""
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(i?B?|B)?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"{text!r} is not a size (say 80GiB, 141GiB or 24GB)")
    number, prefix, suffix = float(m[1]), m[2].upper(), (m[3] or "").lower()
    power = "KMGTP".index(prefix) + 1 if prefix else 0
    base = 1000 if suffix == "b" and prefix else 1024
    return int(number * base**power)


def plural_of(noun: str) -> str:
    if noun in IRREGULAR:
        return IRREGULAR[noun]
    if noun in IRREGULAR.values() or (noun.endswith("s") and not noun.endswith(("ss", "us"))):
        return noun  # already plural: "rows", "tokens" as the jobs name their units
    if noun.endswith(("ss", "us", "x", "ch", "sh")):
        return noun + "es"
    if noun.endswith("y") and noun[-2:-1] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def singular_of(noun: str) -> str:
    for one, many in IRREGULAR.items():
        if many == noun:
            return one
    if noun.endswith("ies"):
        return noun[:-3] + "y"
    if noun.endswith("s") and not noun.endswith(("ss", "us")):
        return noun[:-1]
    return noun


def noun_for(n: int | None, noun: str) -> str:
    """The noun agreeing with `n` ("row" for 1, else "rows"), given either way."""
    return singular_of(noun) if n == 1 else plural_of(noun)


def count(n: int, noun: str) -> str:
    """`n` with thousands separators and the noun agreeing with it: "1 row", "0 rows", "12,000 rows".
    The noun may be given either way ("row" or "rows"): the units jobs report are plural."""
    return f"{n:,} {noun_for(n, noun)}"


def duration(seconds: float) -> str:
    """A span of time as people read it: "350 ms", "4.2 s", "3 min 20 s", "2 h 5 min"."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(int(seconds), 60)
    return f"{minutes} min {sec} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


def rate(per_second: float, unit: str) -> str:
    """A rate in `unit`s per second ("1.2 MiB/s" for bytes, "350 rows/s"); below one a second, per
    minute, so a slow job does not read "0.0 chunks/s"."""
    if unit == "bytes":
        return f"{binary_size(per_second)}/s"
    word = plural_of(unit)
    if per_second >= 100:
        return f"{per_second:,.0f} {word}/s"
    if per_second >= 1:
        return f"{per_second:.1f} {word}/s"
    return f"{per_second * 60:.1f} {word}/min"
