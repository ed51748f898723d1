"""Fit every model of a predictor bundle from the datasets, deterministically for the same data and seed."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import polars as pl
from sklearn.model_selection import GroupKFold

from perfpredict.core.dataset import data_hash
from perfpredict.learn.bundle import Bundle
from perfpredict.learn.compose import compose
from perfpredict.learn.kernels import KernelModel
from perfpredict.learn.plan_model import RatioRegressor, calibrate_margin, conformal_quantiles
from perfpredict.train.data import load_probes, load_runs, memory_rows, oom_rows, time_rows

c = pl.col


def _weights(df: pl.DataFrame) -> np.ndarray:
    """Each source weighs the same in total, so 1440 vtrain rows do not drown 300 of ours."""
    counts = df.group_by("source").len()
    w = df.join(counts, on="source", how="left")["len"].to_numpy().astype(float)
    return (1.0 / w) * len(w) / counts.height


def fit_plan_models(runs: pl.DataFrame, kernels: KernelModel, *, seed: int = 0
                    ) -> tuple[RatioRegressor, RatioRegressor, float]:
    """Time and memory regressors and the OOM margin on composed runs (runs must already have k_* columns)."""
    tr = time_rows(runs)
    time = RatioRegressor(featurizer="time", baseline="k_step_s", seed=seed, domain="framework")
    time.fit(tr, tr["step_time_s"].to_numpy(), _weights(tr))
    mr = memory_rows(runs)
    mem = RatioRegressor(featurizer="memory", baseline="d_mem_gib", seed=seed, domain="device")
    mem.fit(mr, mr["peak_memory_gib"].to_numpy(), _weights(mr))
    orows = oom_rows(runs)
    margin = calibrate_margin(mem.predict(orows), orows["g_memory_gib"].to_numpy(), orows["fits"].to_numpy())
    return time, mem, margin


def out_of_fold(runs: pl.DataFrame, kernels: KernelModel, *, seed: int = 0, folds: int = 5) -> pl.DataFrame:
    """Predictions for every row from models that did not see its model group (GroupKFold by model)."""
    groups = runs["model_group"].to_numpy()
    n = min(folds, len(np.unique(groups)))
    t_pred = np.full(runs.height, np.nan)
    m_pred = np.full(runs.height, np.nan)
    for train_idx, test_idx in GroupKFold(n_splits=n).split(np.zeros(runs.height), groups=groups):
        tr = runs[train_idx]
        te = runs[test_idx]
        time, mem, _ = fit_plan_models(tr, kernels, seed=seed)
        t_pred[test_idx] = time.predict(te)
        m_pred[test_idx] = mem.predict(te)
    return runs.with_columns(oof_time_s=pl.Series(t_pred), oof_mem_gib=pl.Series(m_pred))


def train_bundle(*, data: Path | str, seed: int = 0, progress=None) -> tuple[Bundle, pl.DataFrame]:
    """Fit kernels on all probes, compose all runs, fit the plan models; conformal bounds and margin come from
    out-of-fold residuals. Returns the bundle and the composed runs (for evaluation)."""
    step = progress or (lambda msg: None)
    step("loading datasets")
    probes = load_probes(data)
    runs = load_runs(data)
    step(f"fitting kernel models on {probes.height} probes")
    kernels = KernelModel(seed=seed).fit(probes)
    step(f"composing {runs.height} runs")
    runs = compose(runs, kernels)
    step("out-of-fold predictions for intervals")
    oof = out_of_fold(runs, kernels, seed=seed)
    tr = time_rows(oof)
    mr = memory_rows(oof)
    t_int = conformal_quantiles(np.log10(tr["step_time_s"].to_numpy() / tr["oof_time_s"].to_numpy()))
    m_int = conformal_quantiles(np.log10(mr["peak_memory_gib"].to_numpy() / mr["oof_mem_gib"].to_numpy()))
    orows = oom_rows(oof)
    margin = calibrate_margin(orows["oof_mem_gib"].to_numpy(), orows["g_memory_gib"].to_numpy(),
                              orows["fits"].to_numpy())
    step("fitting plan-level models on all rows")
    time, mem, _ = fit_plan_models(runs, kernels, seed=seed)
    meta = {
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "seed": seed,
        "data_hash": {"probes": data_hash(probes.select(sorted(probes.columns))),
                      "runs": data_hash(runs.select(sorted(c_ for c_ in runs.columns if not c_.startswith(("d_", "k_")))))},
        "rows": {"probes": probes.height, "runs": runs.height, "time_labels": time_rows(runs).height,
                 "memory_labels": memory_rows(runs).height, "oom_labels": oom_rows(runs).height},
        "sources": sorted(runs["source"].unique().to_list()),
        "hardware": sorted(set(runs["g_name"].unique().to_list()) | set(probes["hardware"].unique().to_list())),
    }
    return Bundle(kernels=kernels, time=time, memory=mem, time_interval=t_int, memory_interval=m_int,
                  oom_margin=margin, metadata=meta), oof
