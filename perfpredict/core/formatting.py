"""Numbers formatted for people: one rule per kind of number, shared by the CLI tables and the generated docs.

`14,240 tok/s`, not `1.424e+04`: grouped thousands and a number of decimals that depends on the size of the
number only, so a column reads the same way from row to row."""

from __future__ import annotations

import math


def missing(x: object) -> bool:
    """None or NaN: shown as "-"."""
    return x is None or (isinstance(x, float) and math.isnan(x))


def num(x: float | None) -> str:
    """A rate or count: 14,240 / 342 / 34.4 / 1.19 / 0.169."""
    if missing(x):
        return "-"
    a = abs(x)
    if a >= 100:
        return f"{x:,.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def num_range(lo: float | None, hi: float | None) -> str:
    return f"{num(lo)}-{num(hi)}"


def pct(x: float | None, decimals: int = 1) -> str:
    """A fraction as a percentage: 0.1234 -> 12.3%."""
    if missing(x):
        return "-"
    return f"{100 * x:.{decimals}f}%"


def count(x: int | None) -> str:
    """A whole number with grouped thousands: 5,334."""
    return "-" if missing(x) else f"{int(x):,}"


def seconds(s: float | None) -> str:
    """A duration given in seconds: 117 s / 2.1 min / 1.6 h."""
    if missing(s):
        return "-"
    return f"{s:.0f} s" if s < 120 else (f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h")


def hours(h: float | None) -> str:
    """A duration given in hours: 29 min / 1.0 h / 2.5 d."""
    if missing(h):
        return "-"
    return f"{h * 60:.0f} min" if h < 1 else (f"{h:.1f} h" if h < 48 else f"{h / 24:.1f} d")


def merge_counts(counts: list[tuple[str, int]]) -> list[str]:
    """(reason, count) pairs as people read them: 'TP1 x8: weights leave no KV space (3)'."""
    return [f"{k} ({n:,})" for k, n in counts]
