"""Ties at the top of a ranking: which candidates the prediction cannot tell apart, and what separates them.

A ranking sorts point predictions, but each has a 90 % interval. When the runner-up's interval overlaps the best's,
"X wins by 40 %" overstates what is known: the candidates whose intervals overlap the best's are tied, and the
useful answer is that set and how the candidates in it differ (the knobs a user would then try). Used by
`generate rank` and `iteration`; training `rank` can use it the same way (tied_top on samples_per_s with
step-time-derived bounds)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from perfpredict.core.errors import PerfPredictError

SHOWN = 4  # tied candidates a sentence names; the rest are counted


@dataclass(frozen=True)
class Tie:
    """The best candidate, the candidates tied with it (best first, the best included), and the runner-up."""

    best: str
    tied: tuple[str, ...]
    runner_up: str | None
    margin: float                 # how much better the best's point is than the runner-up's (0.4 = 40 %)
    separated: bool               # the runner-up's interval does not overlap the best's
    differ: dict[str, list[Any]] = field(default_factory=dict)  # knobs that differ among the tied, their values

    @property
    def is_tie(self) -> bool:
        return len(self.tied) > 1

    def sentence(self, what: str = "predicted") -> str:
        """One line for people: a separated winner with its margin, or the tied set and what separates it."""
        if self.runner_up is None:
            return f"{self.best} is the only candidate"
        if self.separated:
            return (f"{self.best} is best: {100 * self.margin:.0f} % above {self.runner_up} on the {what} point, "
                    "and their 90 % intervals do not overlap")
        knobs = "; ".join(f"{k} {'/'.join(str(v) for v in vals)}" for k, vals in self.differ.items())
        shown = "; ".join(self.tied[:SHOWN]) + (f"; and {len(self.tied) - SHOWN} more" if len(self.tied) > SHOWN
                                               else "")
        return (f"tied: {len(self.tied)} candidates whose 90 % intervals overlap the best's ({shown}); the best's "
                f"{what} point is {100 * self.margin:.0f} % ahead of {self.runner_up}'s"
                + (f"; they differ in {knobs}" if knobs else ""))

    def to_dict(self) -> dict[str, Any]:
        return {"best": self.best, "tied": list(self.tied), "runner_up": self.runner_up, "margin": self.margin,
                "separated": self.separated, "differ": self.differ}


def _bounds(df: pl.DataFrame, lo: str, hi: str | None) -> tuple[list[float], list[float]]:
    if hi is None:  # one list column [lo, hi]
        pairs = df[lo].to_list()
        return [p[0] for p in pairs], [p[1] for p in pairs]
    return df[lo].to_list(), df[hi].to_list()


def tied_top(df: pl.DataFrame, *, value: str, lo: str, hi: str | None = None, label: str,
             higher_is_better: bool = True, knobs: Sequence[str] = ()) -> Tie:
    """The tie at the top of `df` (already restricted to the candidates that run), by `value` with 90 % bounds `lo`
    and `hi` (or one list column `lo` holding [lo, hi]). Candidate r is tied with the best b when their intervals
    overlap: r.hi >= b.lo for a value where higher is better (throughput), r.lo <= b.hi where lower is (time).
    `knobs`: columns reported when they differ among the tied candidates."""
    if df.height == 0:
        raise PerfPredictError("no candidate to compare")
    for col in (value, lo, label, *(c for c in (hi,) if c), *knobs):
        if col not in df.columns:
            raise PerfPredictError(f"ties: no column {col!r}; columns: {', '.join(df.columns)}")
    d = df.sort(value, descending=higher_is_better, nulls_last=True)
    los, his = _bounds(d, lo, hi)
    vals, labels = d[value].to_list(), d[label].to_list()
    if higher_is_better:
        overlaps = [his[i] >= los[0] for i in range(d.height)]
    else:
        overlaps = [los[i] <= his[0] for i in range(d.height)]
    tied_idx = [i for i in range(d.height) if i == 0 or overlaps[i]]
    runner = 1 if d.height > 1 else None
    margin = 0.0
    if runner is not None and vals[runner] and vals[0]:
        margin = vals[0] / vals[runner] - 1 if higher_is_better else vals[runner] / vals[0] - 1
    differ: dict[str, list[Any]] = {}
    for k in knobs:
        seen: list[Any] = []
        for i in tied_idx:
            v = d[k][i]
            if v not in seen:
                seen.append(v)
        if len(seen) > 1:
            differ[k] = seen
    return Tie(best=labels[0], tied=tuple(labels[i] for i in tied_idx),
               runner_up=labels[runner] if runner is not None else None, margin=margin,
               separated=runner is not None and not overlaps[runner], differ=differ)


def comparison(tie: Tie, other: str, pct: float) -> str:
    """How #1 compares with another candidate: '+40% for #1' only when the intervals separate them."""
    if other in tie.tied:
        return f"{pct:+.0f}% for #1 on the point, tied within the 90 % intervals"
    return f"{pct:+.0f}% for #1"
