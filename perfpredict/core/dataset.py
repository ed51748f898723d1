"""Reading and writing the dataset tables shared by collect (writes), the public importers (write) and train (reads).

Their columns are core.schema's; tables are parquet under datasets/:
- probes: one row per kernel or collective measurement.
- runs: one row per end-to-end training-step measurement (or failed attempt), described by the flat
  scenario columns of perfpredict.core.scenario.flat_row plus labels and provenance.
Every row carries provenance. Writes are atomic (temp file + rename) so a crash loses at most the row in flight.
No torch here: train and the predictor read these files on machines without it."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

import polars as pl

# The CPU timing gate (declared in core.gates, importable without polars; these names stay importable from here).
from perfpredict.core.gates import CALIB_RATIO_MAX, OTHER_LOAD_MAX_CORES  # noqa: F401

# The tables' columns are declared in core.schema; these names stay importable from here for collect and train.
from perfpredict.core.schema import (  # noqa: F401
    ATTN_IMPLS,
    LABEL_COLUMNS,
    PROBE_COLUMNS,
    PROVENANCE,
    SCHEMA_VERSION,
    probe_schema,
)


def empty_frame(columns: dict[str, Any]) -> pl.DataFrame:
    return pl.DataFrame(schema=columns)


def conform(df: pl.DataFrame, columns: dict[str, Any]) -> pl.DataFrame:
    """Add missing schema columns as nulls and cast known ones, keeping extra columns at the end."""
    exprs = []
    for name, dtype in columns.items():
        if name in df.columns:
            exprs.append(pl.col(name).cast(dtype, strict=False))
        else:
            exprs.append(pl.lit(None, dtype=dtype).alias(name))
    extra = [c for c in df.columns if c not in columns]
    return df.select(exprs + [pl.col(c) for c in extra])


def write_atomic(df: pl.DataFrame, path: Path | str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        df.write_parquet(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def append_rows(path: Path | str, rows: list[dict[str, Any]], schema: dict[str, Any] | None = None) -> pl.DataFrame:
    """Append rows to a parquet file atomically (read, concat, write to temp, rename); returns the appended rows.

    With a schema, its types are imposed before anything is inferred (and its missing columns added, extras kept
    at the end): a column that is null in every new row (error on a good run, step time on a failed one) would
    otherwise land as the Null type, so every file keeps the same column types from its first row on."""
    path = Path(path)
    if schema is None:
        new = pl.DataFrame(rows, infer_schema_length=None)
    else:
        present = {k for r in rows for k in r}
        new = conform(pl.DataFrame(rows, schema_overrides={k: v for k, v in schema.items() if k in present},
                                   infer_schema_length=None), schema)
    whole = pl.concat([pl.read_parquet(path), new], how="diagonal_relaxed") if path.exists() else new
    write_atomic(whole, path)
    return new


def read_tables(root: Path | str, table: str) -> pl.DataFrame:
    """All parquet files named `<table>*.parquet` anywhere under root, concatenated (diagonal), each CPU row on
    the catalog entry of the host that measured it (on_measuring_host)."""
    root = Path(root)
    files = sorted(p for p in root.rglob(f"{table}*.parquet") if not p.name.startswith("."))
    if not files:
        return pl.DataFrame()
    return on_measuring_host(pl.concat([pl.read_parquet(f) for f in files], how="diagonal_relaxed"))


def on_measuring_host(df: pl.DataFrame) -> pl.DataFrame:
    """CPU rows named after the catalog entry that describes the host in their own hardware_fingerprint
    (core.catalog.cpu_hardware_for): `hardware`, and where present the flat scenario's g_* figures and link rates.

    Collect wrote `hardware` = cpu on every CPU host until 2026-12-01, while three hosts measured: the CPU kernel
    probes of one (an AVX-512F Xeon) would otherwise time the steps of another (an AVX2-only EPYC runs fp32 GEMMs
    2.1x and bf16 attention 3.8x slower). A row whose host has no entry keeps what it says."""
    if df.is_empty() or not {"hardware", "hardware_fingerprint"} <= set(df.columns):
        return df
    import json

    from perfpredict.core.catalog import cpu_hardware_for, get_gpu
    from perfpredict.core.hardware import Cluster
    from perfpredict.core.scenario import cluster_columns

    mapping = {}
    for fp in df["hardware_fingerprint"].drop_nulls().unique().to_list():
        try:
            name = cpu_hardware_for(json.loads(fp))
        except (TypeError, ValueError):
            name = None
        if name is not None:
            mapping[fp] = name
    if not mapping:
        return df
    hw = pl.col("hardware_fingerprint").replace_strict(mapping, default=None, return_dtype=pl.Utf8)
    df = df.with_columns(hardware=pl.coalesce(hw, pl.col("hardware")))
    for name in sorted(set(mapping.values())):
        # The entry's own figures and link rates; the row keeps its GPU and node counts.
        figures = {k: v for k, v in cluster_columns(Cluster(get_gpu(name), 1, 1)).items()
                   if k.startswith("g_") or k.endswith("_bw_gb_per_s")}
        here = pl.col("hardware") == name
        df = df.with_columns([pl.when(here).then(pl.lit(v)).otherwise(pl.col(k)).alias(k)
                              for k, v in figures.items() if k in df.columns])
    return df


def data_hash(df: pl.DataFrame) -> str:
    h = hashlib.sha256()
    h.update(str(df.schema).encode())
    h.update(str(df.height).encode())
    for s in df.hash_rows(seed=0).sort():
        h.update(int(s).to_bytes(8, "little"))
    return h.hexdigest()[:16]
