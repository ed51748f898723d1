"""The one exception type users see: a domain error whose message is a single line."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class PerfPredictError(ValueError):
    """Bad input or an impossible request. The CLI prints its message on one line, never a traceback."""


def close_names(name: str, known: Iterable[str], n: int = 5) -> list[str]:
    """What the user probably meant: names starting with what was typed, then names containing it ("h100" -> every
    h100 variant, which difflib's ratio ranks below h800 and b200), then difflib's close matches."""
    known = sorted(known)
    typed = name.strip().lower()
    # Every name starting with what was typed is shown (up to 10): "qwen2.5" names all seven sizes, so the one
    # meant is among them whichever it is.
    starts = [k for k in known if typed and k.startswith(typed)][:max(n, 10)]
    close = starts + [k for k in known if typed and typed in k and k not in starts]
    close += [k for k in difflib.get_close_matches(typed, known, n=n, cutoff=0.4) if k not in close]
    return close[:max(n, len(starts))] or known[:n]


def unknown(kind: str, name: str, known: Iterable[str], *, listed_by: str = "perfpredict catalog") -> PerfPredictError:
    known = list(known)
    return PerfPredictError(
        f"unknown {kind} {name!r}; close names: {', '.join(close_names(name, known))} "
        f"({len(known)} known: `{listed_by}` lists them)"
    )


def require(cond: bool, message: str) -> None:
    if not cond:
        raise PerfPredictError(message)


# --- checks every entry point runs before any arithmetic: type first, then the accepted range in the message ------

def _show(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def check_int(name: str, v: object, lo: int, hi: int) -> int:
    """An integer (never a bool: JSON true is not 1) within lo..hi."""
    if not isinstance(v, int) or isinstance(v, bool):
        raise PerfPredictError(f"{name} must be an integer in {lo}..{hi}, got {_show(v)}")
    if not lo <= v <= hi:
        raise PerfPredictError(f"{name} must be an integer in {lo}..{hi}, got {v}")
    return v


def check_number(name: str, v: object, lo: float, hi: float, *, lo_open: bool = False) -> float:
    """A finite real number (int or float, never a bool) within [lo, hi] (or (lo, hi] with lo_open)."""
    import math

    rng = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        raise PerfPredictError(f"{name} must be a number in {rng}, got {_show(v)}")
    if v > hi or v < lo or (lo_open and v == lo):
        raise PerfPredictError(f"{name} must be a number in {rng}, got {v:g}")
    return v


def check_bool(name: str, v: object) -> bool:
    if not isinstance(v, bool):
        raise PerfPredictError(f"{name} must be true or false, got {_show(v)}")
    return v


def check_choice(name: str, v: object, accepted: Iterable[str]) -> str:
    accepted = list(accepted)
    if not isinstance(v, str) or v not in accepted:
        raise PerfPredictError(f"unknown {name} {_show(v)}; accepted: {', '.join(accepted)}")
    return v


def check_str(name: str, v: object, max_len: int = 200) -> str:
    if not isinstance(v, str) or not v or len(v) > max_len:
        raise PerfPredictError(f"{name} must be a non-empty string of at most {max_len} characters, got {_show(v)}")
    return v
