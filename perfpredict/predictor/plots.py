"""Plots people would rather look at than tables (needs the `plot` extra)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from perfpredict.core.errors import PerfPredictError


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise PerfPredictError("plots need matplotlib: pip install 'perfpredict[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def pareto_front(mem: np.ndarray, thr: np.ndarray) -> np.ndarray:
    """Indices of plans no other plan beats on both lower memory and higher throughput."""
    order = np.lexsort((-thr, mem))
    best, front = -np.inf, []
    for i in order:
        if thr[i] > best:
            front.append(i)
            best = thr[i]
    return np.array(front, dtype=int)


def pareto_plot(ranking, path: Path | str) -> Path:
    plt = _pyplot()
    df = ranking.table
    mem = df["peak_memory_gib"].to_numpy()
    thr = df["samples_per_s"].to_numpy()
    fits = df["fits"].to_numpy()
    cap = float(df["g_memory_gib"][0])
    fig, ax = plt.subplots(figsize=(9, 6))
    ax.scatter(mem[fits], thr[fits], s=10, alpha=0.5, label=f"fits ({fits.sum()})")
    risky = (df["fit_verdict"] == "at risk").to_numpy() if "fit_verdict" in df.columns else np.zeros_like(fits)
    ax.scatter(mem[risky], thr[risky], s=10, alpha=0.4, c="orange", label=f"at risk of OOM ({risky.sum()})")
    out = ~fits & ~risky
    ax.scatter(mem[out], thr[out], s=10, alpha=0.3, c="grey", label=f"does not fit ({out.sum()})")
    if fits.any():
        idx = np.flatnonzero(fits)[pareto_front(mem[fits], thr[fits])]
        ax.plot(mem[idx], thr[idx], "r-o", ms=4, label="Pareto front")
        ax.annotate("#1 " + df["plan"][0], (mem[0], thr[0]), fontsize=7, xytext=(5, 5), textcoords="offset points")
    ax.axvline(cap, color="k", ls="--", lw=1, label=f"GPU memory {cap:.0f} GiB")
    if fits.any() and "fit_limit_gib" in df.columns:
        # Each plan has its own margin (its memory interval, the calibrated cell margin): the #1 plan's limit.
        best = int(np.flatnonzero(fits)[0])
        ax.axvline(float(df["fit_limit_gib"][best]), color="k", ls=":", lw=1,
                   label=f"fit limit of #1 (margin {100 * float(df['oom_margin'][best]):+.0f}%)")
    unit = "pairs" if ranking.workload.is_preference else "samples"
    ax.set_xlabel("predicted peak memory per GPU (GiB)")
    ax.set_ylabel(f"predicted {unit}/s")
    ax.set_title(f"{ranking.model.name} on {ranking.cluster.gpus} x {ranking.cluster.gpu.name}: "
                 f"{ranking.workload.objective}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def layouts_plot(r, path: Path) -> Path:
    """KV capacity per replica against predicted output tokens/s, one colour per TP degree."""
    import polars as pl

    plt = _pyplot()
    f = r.fitting
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for tp in sorted(set(f["tp"].to_list())):
        s = f.filter(pl.col("tp") == tp)
        ax.scatter(s["kv_capacity_tokens"].to_list(), s["output_tokens_per_s"].to_list(), label=f"TP{tp}", s=30)
    ax.set_xscale("log")
    ax.set_xlabel("KV capacity per replica (tokens)")
    ax.set_ylabel("predicted output tokens/s (all replicas)")
    ax.set_title(f"{r.model.name} on {r.cluster.gpus} x {r.cluster.gpu.name}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
