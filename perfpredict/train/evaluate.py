"""Held-out evaluation: leave-one-model-out and leave-one-hardware-out, never random rows.

For every held-out group the plan models (and, for a held-out hardware, the kernel models too) are refit without
it; the metrics are computed on its rows only. The composition alone and the analytic estimate are scored on the
same rows, so the value the learning adds is visible."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl
from scipy.stats import spearmanr

from perfpredict.learn.compose import compose
from perfpredict.learn.kernels import KernelModel
from perfpredict.train.data import load_probes, load_runs, memory_rows, oom_rows, time_rows
from perfpredict.train.fit import fit_plan_models

c = pl.col


def _ape(pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    return np.abs(pred / true - 1.0)


def _summary(ape: np.ndarray) -> dict[str, float]:
    if ape.size == 0:
        return {"n": 0, "mape": float("nan"), "median_ape": float("nan"), "p90_ape": float("nan")}
    return {"n": int(ape.size), "mape": float(ape.mean()), "median_ape": float(np.median(ape)),
            "p90_ape": float(np.quantile(ape, 0.9))}


def held_out_predictions(runs: pl.DataFrame, probes: pl.DataFrame, *, by: str, seed: int = 0,
                         kernels: KernelModel | None = None, progress: Callable[[str], None] | None = None
                         ) -> pl.DataFrame:
    """One prediction per row from models that never saw the row's group (`model_group` or `g_name`)."""
    step = progress or (lambda m: None)
    groups = runs[by].unique().sort().to_list()
    parts = []
    for g in groups:
        step(f"{by}={g}")
        if by == "g_name" or kernels is None:
            # A held-out hardware must not lend its probes to the kernels either.
            kp = probes.filter(c("hardware") != g) if by == "g_name" else probes
            k = KernelModel(seed=seed).fit(kp)
        else:
            k = kernels
        composed = compose(runs.drop([x for x in runs.columns if x.startswith("k_")]), k)
        train = composed.filter(c(by) != g)
        test = composed.filter(c(by) == g)
        if time_rows(train).height < 20 or memory_rows(train).height < 20:
            continue
        time, mem, margin = fit_plan_models(train, k, seed=seed)
        pred_mem = mem.predict(test)
        parts.append(test.with_columns(
            pred_time_s=pl.Series(time.predict(test)), pred_mem_gib=pl.Series(pred_mem),
            pred_fits=pl.Series(pred_mem * (1 + margin) <= test["g_memory_gib"].to_numpy()),
            heldout_by=pl.lit(by), heldout_group=pl.lit(str(g))))
    return pl.concat(parts, how="diagonal_relaxed") if parts else pl.DataFrame()


def _ranking(df: pl.DataFrame) -> dict[str, float]:
    """Within each (model, cluster, workload) group: Spearman of predicted vs measured throughput and the regret
    of picking the predicted best (fraction of the best measured throughput lost)."""
    rhos, regrets = [], []
    for _, g in df.group_by("cluster_group"):
        if g.height < 3:
            continue
        meas = g["d_tokens_per_step"].to_numpy() / g["step_time_s"].to_numpy()
        pred = g["d_tokens_per_step"].to_numpy() / g["pred_time_s"].to_numpy()
        if np.ptp(meas) > 0 and np.ptp(pred) > 0:
            rhos.append(spearmanr(meas, pred).statistic)
        regrets.append(1.0 - meas[np.argmax(pred)] / meas.max())
    return {"groups": len(regrets), "spearman": float(np.nanmean(rhos)) if rhos else float("nan"),
            "top1_regret": float(np.mean(regrets)) if regrets else float("nan")}


def metrics(pred: pl.DataFrame, key: str) -> pl.DataFrame:
    """One row per value of `key` (source or hardware) with every metric, learned vs baselines."""
    rows = []
    for (val,), g in sorted(pred.group_by(key), key=lambda t: str(t[0])):
        tr, mr, orow = time_rows(g), memory_rows(g), oom_rows(g)
        row = {key: val}
        t_true = tr["step_time_s"].to_numpy()
        for name, col in (("time", "pred_time_s"), ("time_composed", "k_step_s"), ("time_analytic", "d_analytic_step_s")):
            row |= {f"{name}_{k}": v for k, v in _summary(_ape(tr[col].to_numpy(), t_true)).items()}
        m_true = mr["peak_memory_gib"].to_numpy()
        for name, col in (("mem", "pred_mem_gib"), ("mem_analytic", "d_mem_gib")):
            row |= {f"{name}_{k}": v for k, v in _summary(_ape(mr[col].to_numpy(), m_true)).items()}
        if orow.height:
            fits = orow["fits"].to_numpy()
            row["oom_n"] = orow.height
            row["oom_accuracy"] = float(np.mean(orow["pred_fits"].to_numpy() == fits))
            row["oom_accuracy_analytic"] = float(np.mean(
                (orow["d_mem_gib"].to_numpy() <= orow["g_memory_gib"].to_numpy()) == fits))
        row |= {f"rank_{k}": v for k, v in _ranking(tr).items()}
        rows.append(row)
    return pl.DataFrame(rows)


def evaluate(*, data: Path | str, seed: int = 0, progress: Callable[[str], None] | None = None,
             subset: int | None = None) -> dict[str, pl.DataFrame]:
    """Both held-out schemes; returns per-source and per-hardware metric tables and the predictions."""
    probes = load_probes(data)
    runs = load_runs(data)
    if subset:
        runs = runs.sample(n=min(subset, runs.height), seed=seed, shuffle=False)
    kernels = KernelModel(seed=seed).fit(probes)
    lomo = held_out_predictions(runs, probes, by="model_group", seed=seed, kernels=kernels, progress=progress)
    loho = held_out_predictions(runs, probes, by="g_name", seed=seed, progress=progress)
    out = {"predictions_model": lomo, "predictions_hardware": loho}
    if lomo.height:
        out["by_source"] = metrics(lomo, "source")
    if loho.height:
        out["by_hardware"] = metrics(loho, "g_name")
    return out


def plot_predicted_vs_measured(pred: pl.DataFrame, path: Path | str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    for ax, (true, p, label, rows) in zip(axes, (("step_time_s", "pred_time_s", "step time (s)", time_rows),
                                                 ("peak_memory_gib", "pred_mem_gib", "peak memory (GiB)", memory_rows)),
                                          strict=True):
        sub = rows(pred)  # the rows the metrics score: labels that passed their gates
        for (src,), g in sub.group_by("source"):
            ax.scatter(g[true], g[p], s=8, alpha=0.6, label=f"{src} ({g.height})")
        if sub.height:
            lo = float(min(sub[true].min(), sub[p].min()))
            hi = float(max(sub[true].max(), sub[p].max()))
            ax.plot([lo, hi], [lo, hi], "k--", lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"measured {label}")
        ax.set_ylabel(f"predicted {label} (held-out model)")
        ax.legend(fontsize=8)
    fig.suptitle("perfpredict: predicted vs measured, leave-one-model-out")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
