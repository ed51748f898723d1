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
    return compute_descriptors(memory_descriptors(trainer_reference(df)))


def trainer_reference(df: pl.DataFrame) -> pl.DataFrame:
    """A live reference as the plan's trainer holds it (core.frameworks.reference_handling): NeMo-Aligner's and
    NeMo-RL's DPO keep the reference weights in host memory and swap them in (the `offloaded` mode), so a Megatron
    or FSDP2 DPO plan is predicted the way its trainer runs, not with a second model resident on the GPU."""
    if not {"p_framework", "w_objective", "w_reference"} <= set(df.columns) or df.height == 0:
        return df
    from perfpredict.core.frameworks import CAPABILITIES, reference_handling

    pairs = df.select("p_framework", "w_objective").unique().rows()
    swaps = [(f, o) for f, o in pairs if f in CAPABILITIES and reference_handling(f, o, "live") != "live"]
    if not swaps:
        return df
    hit = pl.lit(False)
    for f, o in swaps:
        hit = hit | ((pl.col("p_framework") == f) & (pl.col("w_objective") == o))
    new = {reference_handling(f, o, "live") for f, o in swaps}
    assert len(new) == 1, new  # one host-swap mode today
    return df.with_columns(w_reference=pl.when(hit & (pl.col("w_reference") == "live")).then(pl.lit(new.pop()))
                           .otherwise(pl.col("w_reference")))
