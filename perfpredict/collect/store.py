"""The column types of collect's tables: the shared schema plus the columns collect adds, imposed by
core.dataset.append_rows so every file has the same column types from its first row on."""

from __future__ import annotations

from typing import Any

import polars as pl

from perfpredict.core.dataset import LABEL_COLUMNS, PROVENANCE, probe_schema

# Columns collect adds after the schema's (dataset.conform keeps extras at the end).
RUN_EXTRAS: dict[str, Any] = {
    "strategy": pl.Utf8, "attempts": pl.Int64, "calib_before_s": pl.Float64, "calib_after_s": pl.Float64,
    "calib_baseline_s": pl.Float64, "steal_cores": pl.Float64, "run_wall_s": pl.Float64, "warmup_steps": pl.Int64,
    "threads_per_rank": pl.Int64, "world_size": pl.Int64, "step_times_s": pl.Utf8, "losses": pl.Utf8,
    "rss_peak_gib": pl.Float64, "ddp_bucket_bytes": pl.Int64, "scenario_json": pl.Utf8, "sweep_seed": pl.Int64,
    "model_shape": pl.Utf8,
}
PROBE_EXTRAS: dict[str, Any] = {"threads": pl.Int64, "oversubscribed": pl.Boolean, "suite": pl.Utf8}


def runs_schema() -> dict[str, Any]:
    return {**LABEL_COLUMNS, **PROVENANCE, **RUN_EXTRAS}


def probes_schema() -> dict[str, Any]:
    return {**probe_schema(), **PROBE_EXTRAS}
