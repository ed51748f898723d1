"""Dataset schema shared by collect (writes), the public importers (write) and train (reads).

Two tables, both parquet under datasets/:
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

SCHEMA_VERSION = 1

# The CPU timing gate of shared/notes/cpu-measurement.md, shared by collect (which retries a disturbed run) and
# train (which keeps only undisturbed step times as labels): calibration workload slowed past 1.12x its baseline,
# or more than 0.3 cores of other work beside the run.
CALIB_RATIO_MAX = 1.12
OTHER_LOAD_MAX_CORES = 0.3

PROVENANCE = {
    "source": pl.Utf8,            # "ours-cpu", "ours-gpu", "vtrain", "ultrascale_playbook", "vidur", "azure"
    "hardware": pl.Utf8,          # GPU catalog name ("cpu" for our CPU runs)
    "hardware_fingerprint": pl.Utf8,  # JSON: device name/count, memory, CPU model, cores, clocks ...
    "software": pl.Utf8,          # JSON: torch, cuda/nccl/gloo, python, perfpredict versions (or upstream's)
    "collected_at": pl.Utf8,      # ISO-8601 date/time of the measurement (upstream commit date for public data)
    "command": pl.Utf8,           # the command that produced the row (or the importer and upstream path)
    "license": pl.Utf8,           # upstream license for public data, "Apache-2.0" for ours
    "schema_version": pl.Int64,
}

PROBE_COLUMNS = {
    "op": pl.Utf8,        # gemm | attention | rmsnorm | swiglu | softmax | cross_entropy | add | adam |
                          # all_reduce | all_gather | reduce_scatter | all_to_all | send_recv | broadcast
    "pass_": pl.Utf8,     # fwd | bwd_input | bwd_weight | fwd_bwd | bwd | step | comm
    "dtype": pl.Utf8,     # bf16 | fp16 | fp32 | fp8
    "m": pl.Int64, "n": pl.Int64, "k": pl.Int64,                 # gemm: (m x k) @ (k x n)
    "batch": pl.Int64, "heads": pl.Int64, "kv_heads": pl.Int64, "seq_len": pl.Int64, "head_dim": pl.Int64,
    "numel": pl.Int64,    # memory-bound ops: elements of the main tensor
    "bytes": pl.Int64,    # collectives: message bytes per rank (nccl-tests 'size'); memory ops: bytes moved
    "world_size": pl.Int64,
    "ranks_per_node": pl.Int64,
    "flops": pl.Float64,  # useful FLOPs of the op (0 for collectives)
    "time_s": pl.Float64,     # median
    "time_spread": pl.Float64,  # coefficient of variation of the repeats (std/mean); null if unknown
    "repeats": pl.Int64,
    "outcome": pl.Utf8,   # ok | oom | timeout | error
    "error": pl.Utf8,
    # attention only (null on every other op):
    "causal": pl.Boolean,  # a causal mask was applied, so a causal kernel computed about half of QK^T and PV; `flops`
                           # counts what was computed (4*b*h*s^2*d, halved when causal; x3.5 for fwd_bwd)
    "attn_impl": pl.Utf8,  # kernel that ran: flash2 | flash3 | cudnn | mem_efficient | math | sdpa-cpu; null unknown.
                           # math = unfused matmul + softmax + matmul (scores materialised in memory); sdpa-cpu =
                           # PyTorch's fused flash-style CPU kernel (_scaled_dot_product_flash_attention_for_cpu)
}

ATTN_IMPLS = ("flash2", "flash3", "cudnn", "mem_efficient", "math", "sdpa-cpu")

LABEL_COLUMNS = {
    "run_id": pl.Utf8,
    "outcome": pl.Utf8,            # ok | oom | timeout | error
    "error": pl.Utf8,
    "step_time_s": pl.Float64,     # median over timed steps (null unless ok)
    "step_time_cv": pl.Float64,    # coefficient of variation over timed steps
    "steps_timed": pl.Int64,
    "peak_memory_gib": pl.Float64,  # max over ranks of peak allocated tensor bytes
    "peak_memory_min_gib": pl.Float64,  # min over ranks (pipeline stages differ)
    "peak_reserved_gib": pl.Float64,   # allocator reserved (GPU) where measured
    "memory_by_rank": pl.Utf8,     # JSON list of per-rank peaks (GiB)
    "memory_kind": pl.Utf8,        # what peak_memory_gib is: cuda_max_allocated | live_tensor_peak | reported
    "tokens_per_s": pl.Float64,
    "samples_per_s": pl.Float64,   # pairs/s for preference objectives
    "oversubscribed": pl.Boolean,  # more ranks than cores: measures an overloaded CPU, not devices
    "calib_ratio": pl.Float64,     # calibration workload time after / baseline (CPU timing gate)
    "other_load_cores": pl.Float64,  # CPU used by other processes during the run
    "shrunk_from": pl.Utf8,        # catalog model the shape was shrunk from, if any
}


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


def probe_schema() -> dict[str, Any]:
    return {**PROBE_COLUMNS, **PROVENANCE}


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
