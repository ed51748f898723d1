"""All analytic descriptors of a flat scenario frame, one row per plan. Features, never labels."""

from __future__ import annotations

import polars as pl

from perfpredict.core.schema import DESCRIPTOR_COLUMNS
from perfpredict.features.compute import compute_descriptors
from perfpredict.features.memory import memory_descriptors

# Columns every descriptor frame has, in a stable order: core.schema's (the train stage's feature list is drawn
# from these).
__all__ = ["DESCRIPTOR_COLUMNS", "describe"]


def describe(df: pl.DataFrame) -> pl.DataFrame:
    """Flat scenario frame -> the same frame with every d_* descriptor column."""
    return compute_descriptors(memory_descriptors(df))
