"""Typed, atomic appends of collect rows to parquet.

core.dataset.append_rows infers column types from the new rows, so a column that is null in every new row (error
on a good run, step time on a failed one) would land as the Null type. Here the schema's types (and those of our
extra columns) are imposed first, so every file has the same column types from its first row on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from perfpredict.core.dataset import LABEL_COLUMNS, PROVENANCE, conform, probe_schema, write_atomic

# Columns collect adds after the schema's (dataset.conform keeps extras at the end).
RUN_EXTRAS: dict[str, Any] = {
    "strategy": pl.Utf8, "attempts": pl.Int64, "calib_before_s": pl.Float64, "calib_after_s": pl.Float64,
    "calib_baseline_s": pl.Float64, "run_wall_s": pl.Float64, "warmup_steps": pl.Int64,
    "threads_per_rank": pl.Int64, "world_size": pl.Int64, "step_times_s": pl.Utf8, "losses": pl.Utf8,
    "rss_peak_gib": pl.Float64, "ddp_bucket_gib": pl.Float64, "scenario_json": pl.Utf8, "sweep_seed": pl.Int64,
    "model_shape": pl.Utf8,
}
PROBE_EXTRAS: dict[str, Any] = {"threads": pl.Int64, "oversubscribed": pl.Boolean, "suite": pl.Utf8}


def runs_schema() -> dict[str, Any]:
    return {**LABEL_COLUMNS, **PROVENANCE, **RUN_EXTRAS}


def probes_schema() -> dict[str, Any]:
    return {**probe_schema(), **PROBE_EXTRAS}


def append(path: Path | str, rows: list[dict[str, Any]], schema: dict[str, Any]) -> pl.DataFrame:
    """Append rows (typed by `schema` where it names a column, inferred otherwise) atomically; returns the file's
    new content."""
    path = Path(path)
    present = {k for r in rows for k in r}
    new = pl.DataFrame(rows, schema_overrides={k: v for k, v in schema.items() if k in present},
                       infer_schema_length=None)
    new = conform(new, schema)
    if path.exists():
        new = pl.concat([pl.read_parquet(path), new], how="diagonal_relaxed")
    write_atomic(new, path)
    return new
