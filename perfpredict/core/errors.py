"""The one exception type users see: a domain error whose message is a single line."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class PerfPredictError(ValueError):
    """Bad input or an impossible request. The CLI prints its message on one line, never a traceback."""


def close_names(name: str, known: Iterable[str], n: int = 5) -> list[str]:
    known = sorted(known)
    close = difflib.get_close_matches(name.lower(), known, n=n, cutoff=0.4)
    # Substring hits catch "h100" -> every h100 variant, which difflib's ratio misses.
    close += [k for k in known if name.lower() in k and k not in close]
    return close[:n] or known[:n]


def unknown(kind: str, name: str, known: Iterable[str]) -> PerfPredictError:
    known = list(known)
    return PerfPredictError(
        f"unknown {kind} {name!r}; close names: {', '.join(close_names(name, known))} "
        f"({len(known)} known: `perfpredict catalog` lists them)"
    )


def require(cond: bool, message: str) -> None:
    if not cond:
        raise PerfPredictError(message)
