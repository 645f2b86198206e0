"""Text for a terminal: exact numbers with grouped digits, and columns that
line up whatever the script (East Asian wide characters take two cells,
combining marks none)."""

from __future__ import annotations

import math
import unicodedata


def exact_number(value: float | int) -> str:
    """``value`` in full with its digits grouped: 1,234,567 (never
    1.23457e+06), 3,000,000,000, 1,234,567.25; a fraction keeps every digit
    of the shortest form that reads back as the same float."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, int) or value.is_integer():
        return f"{int(value):,}"
    text = repr(value)
    if "e" in text:  # small fractions: 1e-07 reads back exactly and stays short
        return text
    whole, _, fraction = text.partition(".")
    sign = "-" if whole.startswith("-") else ""
    return f"{sign}{int(whole.lstrip('-')):,}.{fraction}"


def printable(text: str) -> str:
    """``text`` with control characters shown as escapes, so that a label
    cannot move the cursor or recolour the terminal."""
    return "".join(ch if unicodedata.category(ch)[0] != "C" or ch == " "
                   else ch.encode("unicode_escape").decode("ascii") for ch in text)


def display_width(text: str) -> int:
    """How many terminal cells ``text`` takes."""
    return sum(0 if unicodedata.combining(ch) else
               2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1 for ch in text)


def pad(text: str, width: int, *, right: bool = False) -> str:
    """``text`` padded with spaces to ``width`` cells, on the left when
    ``right`` (right-aligned)."""
    fill = " " * max(0, width - display_width(text))
    return fill + text if right else text + fill
