"""Load the committed datasets and pick the rows each model may learn from."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from perfpredict.core.dataset import CALIB_RATIO_MAX, OTHER_LOAD_MAX_CORES, read_tables
from perfpredict.core.errors import PerfPredictError
from perfpredict.features.descriptors import describe

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


def load_runs(root: Path | str) -> pl.DataFrame:
    runs = read_tables(root, "runs")
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
    return runs.filter(ok)


def memory_rows(runs: pl.DataFrame) -> pl.DataFrame:
    return runs.filter((c("outcome") == "ok") & (c("peak_memory_gib") > 0))


def oom_rows(runs: pl.DataFrame) -> pl.DataFrame:
    """Rows with a known fit/OOM outcome."""
    return runs.filter(c("outcome").is_in(["ok", "oom"])).with_columns(fits=c("outcome") == "ok")
