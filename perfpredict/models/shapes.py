"""Compose each distinct piece of work once: the rows of a plan frame that ask the kernel models the same questions.

A ranking holds tens of thousands of plans, but far fewer distinct (model shape, per-rank work) pairs: ZeRO's
optimizer and parameter offload, for one, change no kernel a rank runs, and the canonical plan (models.compose
canonical_frame: no SP, no recompute, one micro-batch per step) is shared by every plan that differs only in those.
The composition of each distinct row is computed once and broadcast back, which gives every plan exactly the numbers
it would get alone (tests/test_speed.py)."""

from __future__ import annotations

import numpy as np
import polars as pl

ROW = "row"


def distinct_rows(df: pl.DataFrame, keys: list[str] | None = None) -> tuple[pl.DataFrame, np.ndarray]:
    """The first row of each distinct combination of `keys` (default: every column), in order of first occurrence,
    and for each row of df the index of its distinct row. Floats compare by value (0.0 == -0.0), nulls as equal."""
    keys = list(df.columns if keys is None else keys)
    if df.height < 2 or not keys:
        return df, np.arange(df.height)
    # Columns with one value tell no rows apart (a ranking's model, cluster and workload): leave them out of the key.
    counts = df.select(pl.col(keys).n_unique()).row(0)
    keys = [k for k, n in zip(keys, counts, strict=True) if n > 1]
    if not keys:
        return df.head(1), np.zeros(df.height, dtype=np.int64)
    ids = df.select(pl.struct(keys).rank("dense").alias(ROW)).to_series().to_numpy().astype(np.int64) - 1
    first = np.full(int(ids.max()) + 1, df.height, dtype=np.int64)
    np.minimum.at(first, ids, np.arange(df.height))
    order = np.argsort(first, kind="stable")  # distinct rows in order of first occurrence
    renumber = np.empty_like(order)
    renumber[order] = np.arange(len(order))
    return df[first[order]], renumber[ids]
