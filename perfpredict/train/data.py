"""Load the committed datasets and pick the rows each model may learn from."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from perfpredict.core.dataset import CALIB_RATIO_MAX, OTHER_LOAD_MAX_CORES, read_tables
from perfpredict.core.errors import PerfPredictError
from perfpredict.core.schema import FAILED_UNKNOWN
from perfpredict.features.descriptors import describe
from perfpredict.features.trl import trl_mode

c = pl.col
REQUIRED_FLAT = ("m_layers", "m_hidden", "g_name", "c_gpus", "w_seq_len", "p_tp", "p_framework")
# CPU timing gate (core.dataset): a run whose calibration workload slowed past its limit, or that shared the cores
# with other work, measured a busy machine, not the plan. The calibration *before* the run is the gate: the one
# after a heavy multi-rank run reads ~1.2x on a quiet machine (the collect harness saw this), so it flags the
# run's own after-effects rather than outside load.


def default_data_root() -> Path:
    here = Path.cwd() / "datasets"
    if here.exists():
        return here
    return Path(__file__).resolve().parents[2] / "datasets"


TRL_SOURCE_SUFFIX = "-trl"  # ours-cpu -> ours-cpu-trl: TRL's rows are their own source (weights, splits)
# collect trl's `backend` column -> the capability-table framework (core.frameworks) whose plans it ran.
TRL_BACKENDS = {"single": "trl", "ddp": "trl", "fsdp": "trl+fsdp"}


def trl_rows(raw: pl.DataFrame) -> pl.DataFrame:
    """`perfpredict collect trl` rows (datasets/ours/*/trl.parquet, schema in the trl-collect notes) as runs rows.

    - framework: the backend that ran (single/ddp -> trl, fsdp -> trl+fsdp, deepspeed-zN -> trl+deepspeed zero N);
    - source: "<source>-trl", so TRL rows weigh as one source and form their own model groups;
    - w_seq_len: the padded length TRL really ran (padded_len_mean over the measured micro-batches; DPOTrainer
      pads to the longest prompt + completion of each batch, so with length jitter it runs below the nominal
      prompt + completion, kept as w_seq_len_nominal);
    - timing gate: collect trl's own (timing_gate_ok), its competing load standing in for other_load_cores;
    - peak_memory_gib: the live-tensor peak plus DDP's gradient buckets (ddp_bucket_bytes, recorded beside it:
      allocated in C++ at wrap time, invisible to the tensor scan), i.e. every tensor byte the process held; the
      scan alone stays as peak_memory_live_gib."""
    if raw.is_empty():
        return raw
    df = raw
    if "backend" in df.columns:
        ds = c("backend").fill_null("").str.starts_with("deepspeed")
        df = df.with_columns(
            p_framework=pl.when(ds).then(pl.lit("trl+deepspeed")).otherwise(
                c("backend").replace_strict(TRL_BACKENDS, default="trl", return_dtype=pl.Utf8)),
            p_zero=pl.when(ds).then(c("backend").str.extract(r"(\d)$").cast(pl.Int64).fill_null(c("p_zero")))
            .otherwise(c("p_zero")))
    df = df.with_columns(source=pl.concat_str([c("source"), pl.lit(TRL_SOURCE_SUFFIX)]))
    if "padded_len_mean" in df.columns:
        df = df.with_columns(w_seq_len_nominal=c("w_seq_len"),
                             w_seq_len=pl.coalesce(c("padded_len_mean").cast(pl.Float64).round(0).cast(pl.Int64),
                                                   c("w_seq_len")))
    if "competing_load_cores" in df.columns:
        # collect trl's gate (trl-collect notes): calib_ratio (max of the calibration before and after, over its
        # baseline) <= 1.12 and competing_load_cores <= 0.3, the load beyond the cores its ranks leave idle (the raw
        # other_load_cores counts the neighbours on the core a single rank leaves free, always busy here).
        df = df.with_columns(other_load_raw_cores=c("other_load_cores"), other_load_cores=c("competing_load_cores"),
                             timing_gate_ok=(c("calib_ratio") <= CALIB_RATIO_MAX)
                             & (c("competing_load_cores") <= OTHER_LOAD_MAX_CORES))
    if "ddp_bucket_bytes" in df.columns:
        df = df.with_columns(peak_memory_live_gib=c("peak_memory_gib"),
                             peak_memory_gib=c("peak_memory_gib")
                             + c("ddp_bucket_bytes").fill_null(0).cast(pl.Float64) / float(1 << 30))
    return df


def load_trl(root: Path | str) -> pl.DataFrame:
    """Every trl*.parquet under root (collect trl writes datasets/ours/<hardware>/trl.parquet), as runs rows."""
    return trl_rows(read_tables(root, "trl"))


def load_runs(root: Path | str) -> pl.DataFrame:
    runs = read_tables(root, "runs")
    trl = load_trl(root)
    if trl.height:
        runs = pl.concat([runs, trl], how="diagonal_relaxed") if runs.height else trl
    if runs.is_empty():
        raise PerfPredictError(f"no runs*.parquet under {str(root)!r}; run `perfpredict collect runs` or import public data")
    missing = [k for k in REQUIRED_FLAT if k not in runs.columns]
    if missing:
        raise PerfPredictError(f"runs under {str(root)!r} lack scenario columns {missing}")
    runs = runs.filter(pl.all_horizontal([c(k).is_not_null() for k in REQUIRED_FLAT]))
    if "oversubscribed" not in runs.columns:
        runs = runs.with_columns(oversubscribed=pl.lit(False))
    # Unique group labels for held-out evaluation.
    return describe(runs).with_columns(
        # Shapes shrunk from one catalog model are one model for held-out evaluation (stricter than per shape).
        model_group=pl.concat_str([c("source"), pl.coalesce(c("shrunk_from"), c("m_name"))], separator=":"),
        trl_mode=trl_mode(),
        cluster_group=pl.concat_str([c("source"), c("m_name"), c("g_name"), c("c_gpus").cast(pl.Utf8),
                                     c("w_seq_len").cast(pl.Utf8), c("w_global_batch").cast(pl.Utf8),
                                     c("w_objective")], separator=":"),
    )


def load_probes(root: Path | str) -> pl.DataFrame:
    probes = read_tables(root, "probes")
    if probes.is_empty():
        raise PerfPredictError(f"no probes*.parquet under {str(root)!r}; run `perfpredict collect probes`")
    return probes


def time_rows(runs: pl.DataFrame) -> pl.DataFrame:
    """Rows whose step time is a label: measured ok, not an oversubscribed CPU, calibration gate passed."""
    ok = (c("outcome") == "ok") & (c("step_time_s") > 0) & ~c("oversubscribed").fill_null(False)
    if {"calib_before_s", "calib_baseline_s"} <= set(runs.columns):
        ok = ok & ((c("calib_before_s") / c("calib_baseline_s")).fill_null(1.0) <= CALIB_RATIO_MAX)
    if "other_load_cores" in runs.columns:
        ok = ok & (c("other_load_cores").fill_null(0.0) <= OTHER_LOAD_MAX_CORES)
    if "timing_gate_ok" in runs.columns:  # a source's own gate verdict (collect trl), where it gives one
        ok = ok & c("timing_gate_ok").fill_null(True)
    return runs.filter(ok)


def memory_rows(runs: pl.DataFrame) -> pl.DataFrame:
    return runs.filter((c("outcome") == "ok") & (c("peak_memory_gib") > 0))


def oom_rows(runs: pl.DataFrame) -> pl.DataFrame:
    """Rows with a known fit/OOM outcome. A failure whose cause the source does not give (failed_unknown) is not
    one: scored as an OOM it would count crashes, hangs and killed jobs as memory misses."""
    return runs.filter(c("outcome").is_in(["ok", "oom"])).with_columns(fits=c("outcome") == "ok")


def failed_unknown_rows(runs: pl.DataFrame) -> pl.DataFrame:
    """Failures of unknown cause (core.schema: outcome failed_unknown), reported apart from the OOM scores."""
    return runs.filter(c("outcome") == FAILED_UNKNOWN)
