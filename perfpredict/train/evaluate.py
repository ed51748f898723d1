"""Held-out evaluation on splits that extrapolate the way users do, never random rows.

Splits (each fold refits the launch floor, the corrections, their intervals and the margin without its test rows;
a held-out hardware refits the kernel models without that hardware's probes too):
- model: leave one model out (shapes shrunk from one catalog model count as one model);
- width: leave one (source, hidden size) out: every depth of a width at once;
- scale: per source, train on single-node runs and test on multi-node ones (a source without multi-node runs:
  train on the smaller GPU counts, test on its largest);
- hardware: leave one hardware out;
- nodes: per source with multi-node runs, leave one node count out (every multi-node count in turn): the
  held-out-by-model folds of the playbook's 1B train on no multi-node nanotron run (its 8B is the test partition),
  so this is where the stall model (models.stall) is scored on development data;
- trl-shape: leave one TRL model shape out (`perfpredict collect trl` rows, source ours-cpu-trl), trained on every
  other row; scored per trainer x reference mode (metrics_trl);
- trl-host: leave one host's TRL runs out (by the catalog entry its rows read as, core.dataset.on_measuring_host),
  trained on every other row; the host's kernel probes (and TRL-op probes, if any) stay in, as when a user probes a
  new machine and asks about TRL on it; scored per held-out host (metrics_trl_host). Needs TRL rows of two hosts;
- largest: the test partition. Each source's largest model is held out of every other split and of every
  modelling choice; it is scored once, by models trained on everything else.
The composition alone and the analytic estimate are scored on the same rows, so the value the learning adds is
visible, with 90 % interval coverage and the false-OOM rate (ran, but predicted not to fit)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import polars as pl
from scipy.stats import spearmanr

from perfpredict.core.errors import PerfPredictError
from perfpredict.core.schema import SIBLINGS_OVER_GPU, TRL_OPS
from perfpredict.features.compute import on_cpu
from perfpredict.features.trl import is_trl, trl_mode
from perfpredict.models.kernels import KernelModel
from perfpredict.train.data import failed_unknown_rows, load_probes, load_runs, memory_rows, oom_rows, time_rows
from perfpredict.train.fit import DEFAULT_VARIANT, VARIANTS, Variant, fit_bundle, with_stall_labels

c = pl.col
SPLITS = ("model", "width", "scale", "hardware", "nodes", "trl-shape", "trl-host", "largest")
DEV_SPLITS = ("model", "width", "scale", "hardware", "nodes", "trl-shape", "trl-host")


def partition_mask(runs: pl.DataFrame) -> pl.Series:
    """Rows of each source's largest model (by parameters): the untouched test partition."""
    largest = runs.group_by("source").agg(_max=c("m_params").max())
    return runs.join(largest, on="source", how="left", maintain_order="left").select(
        c("m_params") == c("_max")).to_series()


def _scale_test(runs: pl.DataFrame) -> pl.Series:
    multi = runs.group_by("source").agg(_multi=(c("c_nodes") > 1).any(), _max=c("c_gpus").max())
    j = runs.join(multi, on="source", how="left", maintain_order="left")
    return j.select(pl.when(c("_multi")).then(c("c_nodes") > 1).otherwise(c("c_gpus") == c("_max"))).to_series()


def folds(runs: pl.DataFrame, split: str) -> Iterator[tuple[str, np.ndarray]]:
    """(fold name, test mask) for every fold of a split; train is everything else."""
    if split == "model":
        keys = runs["model_group"]
    elif split == "width":
        keys = runs.select(pl.concat_str([c("source"), c("m_hidden").cast(pl.Utf8)], separator=":h")).to_series()
    elif split == "hardware":
        keys = runs["g_name"]
    elif split == "scale":
        test = _scale_test(runs)
        for src in sorted(runs["source"].unique().to_list()):
            mask = (test & (runs["source"] == src)).to_numpy()
            if mask.any() and not mask[(runs["source"] == src).to_numpy()].all():
                yield f"{src}:scale-out", mask
        return
    elif split == "nodes":
        for src in sorted(runs.filter(c("c_nodes") > 1)["source"].unique().to_list()):
            at = runs["source"] == src
            for n in sorted(runs.filter(at & (c("c_nodes") > 1))["c_nodes"].unique().to_list()):
                yield f"{src}:nodes-{n}", (at & (runs["c_nodes"] == n)).to_numpy()
        return
    elif split == "trl-shape":
        trl = runs.select(is_trl().fill_null(False)).to_series()
        for g in sorted(runs.filter(trl)["model_group"].unique().to_list()):
            yield str(g), (trl & (runs["model_group"] == g)).to_numpy()
        return
    elif split == "trl-host":
        trl = runs.select(is_trl().fill_null(False) & on_cpu()).to_series()
        hosts = sorted(runs.filter(trl)["g_name"].unique().to_list())
        if len(hosts) < 2:
            return
        for h in hosts:
            yield str(h), (trl & (runs["g_name"] == h)).to_numpy()
        return
    elif split == "largest":
        yield "largest-model-per-source", partition_mask(runs).to_numpy()
        return
    else:
        raise ValueError(f"unknown split {split!r}; known: {SPLITS}")
    for g in sorted(keys.unique().to_list()):
        yield str(g), (keys == g).to_numpy()


def held_out(runs: pl.DataFrame, probes: pl.DataFrame, *, split: str, seed: int = 0,
             kernels: KernelModel | None = None, variant: Variant = DEFAULT_VARIANT,
             progress: Callable[[str], None] | None = None, fold: str | None = None) -> pl.DataFrame:
    """One prediction per test row of every fold of `split`, from models that never saw the fold; `fold`: that
    fold alone (e.g. one held-out hardware: the whole evaluate takes half an hour, one fold minutes)."""
    step = progress or (lambda m: None)
    base = runs.drop([x for x in runs.columns if x.startswith(("k_", "kc_", "oof_"))])
    chosen = list(folds(base, split))
    if fold is not None:
        names = [n for n, _ in chosen]
        if fold not in names:
            raise PerfPredictError(f"split {split!r} has no fold {fold!r}; its folds: {', '.join(names) or 'none'}")
        chosen = [(n, m) for n, m in chosen if n == fold]
    kernels = kernels or KernelModel(seed=seed).fit(probes)
    parts = []
    for name, mask in chosen:
        step(f"{variant.name}: {split} {name}")
        k = kernels.without(probes, name) if split == "hardware" else kernels
        train, test = base.filter(pl.Series(~mask)), base.filter(pl.Series(mask))
        if time_rows(train).height < 20 or memory_rows(train).height < 20 or not test.height:
            continue
        # Only a held-out hardware's rows read the never-probed-hardware interval; other splits skip its refits.
        seen = probes.filter(c("hardware") != name) if split == "hardware" else probes
        bundle, _ = fit_bundle(train, k, seed=seed, variant=variant, probes=seen if split == "hardware" else None,
                               trl_probes=seen.filter(c("op").is_in(list(TRL_OPS))))
        composed = with_stall_labels(bundle.compose(test))  # measured stalls: what P(stall) is scored against
        parts.append(composed.with_columns(
            **{key: pl.Series(v) for key, v in bundle.apply(composed).items()},
            split=pl.lit(split), fold=pl.lit(name), variant=pl.lit(variant.name)))
    return pl.concat(parts, how="diagonal_relaxed") if parts else pl.DataFrame()


def _ape(pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    return np.abs(pred / true - 1.0)


def _summary(prefix: str, ape: np.ndarray) -> dict[str, float]:
    if ape.size == 0:
        return {f"{prefix}_mape": float("nan"), f"{prefix}_median_ape": float("nan"), f"{prefix}_p90_ape": float("nan")}
    return {f"{prefix}_mape": float(ape.mean()), f"{prefix}_median_ape": float(np.median(ape)),
            f"{prefix}_p90_ape": float(np.quantile(ape, 0.9))}


def _ranking(df: pl.DataFrame) -> dict[str, float]:
    """Within each (model, cluster, workload) group: Spearman of predicted vs measured throughput and the regret
    of picking the predicted best (fraction of the best measured throughput lost). Plans are ordered as `rank`
    orders them: by the throughput expected over the stall regimes where a stall model gives one (models.stall).
    rank_within_5pct: the share of groups whose predicted best plan runs within 5 % of the measured best."""
    rhos, regrets = [], []
    for _, g in df.group_by("cluster_group"):
        if g.height < 3:
            continue
        meas = 1.0 / g["step_time_s"].to_numpy()
        pred = (g["pred_expected_steps_per_s"].fill_null(1.0 / g["pred_time_s"]).to_numpy()
                if "pred_expected_steps_per_s" in g.columns else 1.0 / g["pred_time_s"].to_numpy())
        if np.ptp(meas) > 0 and np.ptp(pred) > 0:
            rhos.append(spearmanr(meas, pred).statistic)
        regrets.append(1.0 - meas[np.argmax(pred)] / meas.max())
    nan = float("nan")
    return {"rank_groups": len(regrets), "rank_spearman": float(np.nanmean(rhos)) if rhos else nan,
            "rank_top1_regret": float(np.mean(regrets)) if regrets else nan,
            "rank_within_5pct": float(np.mean(np.asarray(regrets) <= 0.05)) if regrets else nan}


def _stall_calibration(tr: pl.DataFrame) -> dict[str, float]:
    """P(stall) against the stalls measured (train.fit.with_stall_labels on the fold's test rows) over the rows a
    stall model scored (P > 0): their count, mean P, the stall rate, Brier score and log-loss."""
    nan = float("nan")
    out = {"stall_n": 0, "stall_p_mean": nan, "stall_rate": nan, "stall_brier": nan, "stall_logloss": nan}
    if not tr.height or not {"pred_stall_p", "stalled"} <= set(tr.columns):
        return out
    sc = tr.filter(c("pred_stall_p") > 0)
    if not sc.height:
        return out
    p = np.clip(sc["pred_stall_p"].to_numpy(), 1e-6, 1 - 1e-6)
    y = sc["stalled"].to_numpy().astype(float)
    return {"stall_n": sc.height, "stall_p_mean": float(p.mean()), "stall_rate": float(y.mean()),
            "stall_brier": float(np.mean((p - y) ** 2)),
            "stall_logloss": float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))}


def _widths(prefix: str, point: np.ndarray, lo: np.ndarray, hi: np.ndarray, weight: np.ndarray) -> dict[str, float]:
    """Median 90 % interval width: relative to the point ((hi - lo) / point, the report's `width`) and as high/low,
    over all rows and separately inside (applicability >= 0.5) and outside the measured domain."""
    nan = float("nan")
    if point.size == 0:
        return {f"{prefix}_interval_width": nan, f"{prefix}_interval_ratio": nan,
                f"{prefix}_interval_ratio_inside": nan, f"{prefix}_interval_ratio_outside": nan}
    ratio = hi / lo
    inside = np.nan_to_num(weight) >= 0.5
    return {f"{prefix}_interval_width": float(np.median((hi - lo) / point)),
            f"{prefix}_interval_ratio": float(np.median(ratio)),
            f"{prefix}_interval_ratio_inside": float(np.median(ratio[inside])) if inside.any() else nan,
            f"{prefix}_interval_ratio_outside": float(np.median(ratio[~inside])) if (~inside).any() else nan}


def _failed_unknown(g: pl.DataFrame) -> dict[str, float]:
    """Failures whose cause the source does not give (outcome failed_unknown: the playbook's "crashed or out of
    memory"), reported beside the OOM scores and never in them: their count, the share called "fits", the median
    predicted peak over usable memory and the share predicted under half of it. `implied` are those whose own
    source's measured peaks of the same layout extrapolate past the GPU (importers.playbook.oom_evidence): the
    ones most likely out of memory, with the share of them called "fits" (a diagnostic, not a label)."""
    f = failed_unknown_rows(g)
    nan = float("nan")
    out = {"failed_unknown_n": f.height, "failed_unknown_fits": nan, "failed_unknown_mem_share": nan,
           "failed_unknown_under_half": nan, "failed_implied_oom_n": 0, "missed_oom_implied": nan}
    if not f.height or "fit_verdict" not in f.columns:
        return out
    share = (f["pred_mem_gib"] / f["r_usable_gib"]).to_numpy()
    out |= {"failed_unknown_fits": float((f["fit_verdict"] == "fits").mean()),
            "failed_unknown_mem_share": float(np.nanmedian(share)),
            "failed_unknown_under_half": float(np.mean(share < 0.5))}
    if "oom_evidence" in f.columns:
        imp = f.filter(c("oom_evidence") == SIBLINGS_OVER_GPU)
        out["failed_implied_oom_n"] = imp.height
        out["missed_oom_implied"] = float((imp["fit_verdict"] == "fits").mean()) if imp.height else nan
    return out


def metrics(pred: pl.DataFrame, keys: tuple[str, ...] = ("split", "source")) -> pl.DataFrame:
    """One row per value of `keys` with every metric, learned beside the composition and the analytic baseline."""
    rows = []
    for vals, g in sorted(pred.group_by(list(keys)), key=lambda t: tuple(str(v) for v in t[0])):
        tr, mr, orow = time_rows(g), memory_rows(g), oom_rows(g)
        row = dict(zip(keys, vals, strict=True))
        t_true = tr["step_time_s"].to_numpy()
        row["time_n"] = tr.height
        for name, col in (("time", "pred_time_s"), ("time_composed", "k_step_s"), ("time_analytic", "d_analytic_step_s")):
            row |= _summary(name, _ape(tr[col].to_numpy(), t_true))
        row["time_coverage"] = (float(np.mean((tr["pred_time_lo_s"].to_numpy() <= t_true)
                                              & (t_true <= tr["pred_time_hi_s"].to_numpy()))) if tr.height else np.nan)
        row |= _widths("time", tr["pred_time_s"].to_numpy(), tr["pred_time_lo_s"].to_numpy(),
                       tr["pred_time_hi_s"].to_numpy(), tr["time_weight"].to_numpy())
        row["time_weight_mean"] = float(tr["time_weight"].mean()) if tr.height else np.nan
        m_true = mr["peak_memory_gib"].to_numpy()
        row["mem_n"] = mr.height
        for name, col in (("mem", "pred_mem_gib"), ("mem_analytic", "d_mem_gib")):
            row |= _summary(name, _ape(mr[col].to_numpy(), m_true))
        row["mem_coverage"] = (float(np.mean((mr["pred_mem_lo_gib"].to_numpy() <= m_true)
                                             & (m_true <= mr["pred_mem_hi_gib"].to_numpy()))) if mr.height else np.nan)
        row |= _widths("mem", mr["pred_mem_gib"].to_numpy(), mr["pred_mem_lo_gib"].to_numpy(),
                       mr["pred_mem_hi_gib"].to_numpy(), mr["mem_weight"].to_numpy())
        ran, failed = orow.filter(c("fits")), orow.filter(~c("fits"))
        row["oom_n"] = orow.height
        row["oom_failed_n"] = failed.height
        # false OOM: ran, called "does not fit"; missed OOM: failed, called "fits"; at risk: neither call made.
        row["false_oom"] = float((ran["fit_verdict"] == "does not fit").mean()) if ran.height else np.nan
        row["missed_oom"] = float((failed["fit_verdict"] == "fits").mean()) if failed.height else np.nan
        row |= _failed_unknown(g)
        row["at_risk"] = float((orow["fit_verdict"] == "at risk").mean()) if orow.height else np.nan
        row["false_oom_analytic"] = (float((ran["d_mem_gib"] > ran["g_memory_gib"]).mean()) if ran.height else np.nan)
        # The analytic estimate alone against the same outcomes: failed, yet its peak fits in the GPU's memory.
        row["missed_oom_analytic"] = (float((failed["d_mem_gib"] <= failed["g_memory_gib"]).mean())
                                      if failed.height else np.nan)
        row["oom_accuracy"] = (float(np.mean(orow["pred_fits"].to_numpy() == orow["fits"].to_numpy()))
                               if orow.height else np.nan)
        row |= _ranking(tr)
        row |= _stall_calibration(tr)
        rows.append(row)
    return pl.DataFrame(rows)


def evaluate(*, data: Path | str, seed: int = 0, splits: tuple[str, ...] = SPLITS,
             variants: tuple[str, ...] = (DEFAULT_VARIANT.name,), progress: Callable[[str], None] | None = None,
             subset: int | None = None, sources: tuple[str, ...] = ()) -> dict[str, pl.DataFrame]:
    """Every split for every variant. The test partition is removed before the development splits run, and
    scored only by the `largest` split. Returns the metric table and the predictions.

    `sources` keeps only those sources' runs, and only the probes of their hardware (a quicker evaluation of one
    corner, e.g. ours-cpu + ours-cpu-trl; its numbers are of models trained on that subset)."""
    probes = load_probes(data)
    runs = load_runs(data)
    if sources:
        unknown = sorted(set(sources) - set(runs["source"].unique().to_list()))
        if unknown:
            raise PerfPredictError(f"no runs of source(s) {unknown} under {str(data)!r}; present: "
                                   f"{', '.join(sorted(runs['source'].unique().to_list()))}")
        runs = runs.filter(c("source").is_in(list(sources)))
        probes = probes.filter(c("hardware").is_in(runs["g_name"].unique().to_list()))
    if subset:
        runs = runs.sample(n=min(subset, runs.height), seed=seed, shuffle=False)
    kernels = KernelModel(seed=seed).fit(probes)
    dev = runs.filter(~partition_mask(runs))
    preds = []
    for v in variants:
        if v not in VARIANTS:
            raise PerfPredictError(f"unknown variant {v!r}; known: {', '.join(sorted(VARIANTS))}")
        for split in splits:
            rows = runs if split == "largest" else dev
            preds.append(held_out(rows, probes, split=split, seed=seed, kernels=kernels, variant=VARIANTS[v],
                                  progress=progress))
    preds = [p for p in preds if p.height]
    if not preds:
        raise PerfPredictError(f"no split in {list(splits)} leaves both training and held-out rows for "
                               f"{'source(s) ' + ', '.join(sources) if sources else 'these runs'} (the largest model "
                               "of each source is the test partition, scored only by --split largest); add --split "
                               "largest or more sources")
    pred = pl.concat(preds, how="diagonal_relaxed")
    return {"metrics": metrics_per_split_and_source(pred), "metrics_trl": metrics_trl(pred),
            "metrics_trl_host": metrics_trl_host(pred), "predictions": pred}


ALL_SOURCES = "all"  # the `source` of a split's row over every source's held-out runs together


def metrics_per_split_and_source(pred: pl.DataFrame) -> pl.DataFrame:
    """metrics() per (variant, split, source), and per (variant, split) over all sources (source "all", first),
    so coverage and interval width read per split as well as per source (issue 21)."""
    per_split = metrics(pred.with_columns(source=pl.lit(ALL_SOURCES)), ("variant", "split", "source"))
    return pl.concat([per_split, metrics(pred, ("variant", "split", "source"))], how="diagonal_relaxed")


def metrics_trl_host(pred: pl.DataFrame) -> pl.DataFrame:
    """The trl-host split per held-out host (variant, split, fold = the host): learned, composed (with the TRL
    calibration trained without the host) and analytic step time, peak memory; bias = median(pred / measured - 1)."""
    if "split" not in pred.columns:
        return pl.DataFrame()
    sub = pred.filter(c("split") == "trl-host")
    if not sub.height:
        return pl.DataFrame()
    m = metrics(sub, ("variant", "split", "fold"))
    bias = []
    for (v, f), g in sorted(time_rows(sub).group_by("variant", "fold"), key=lambda t: tuple(map(str, t[0]))):
        r = g["pred_time_s"].to_numpy() / g["step_time_s"].to_numpy() - 1.0
        rc = g["k_step_s"].to_numpy() / g["step_time_s"].to_numpy() - 1.0
        bias.append({"variant": v, "fold": f, "time_bias": float(np.median(r)),
                     "time_composed_bias": float(np.median(rc))})
    return m.join(pl.DataFrame(bias), on=["variant", "fold"], how="left") if bias else m


def held_out_sources(*, data: Path | str, sources: tuple[str, ...], bundle=None, refit: bool = False, seed: int = 0,
                     progress: Callable[[str], None] | None = None) -> dict[str, pl.DataFrame]:
    """A predictor that never saw these sources, scored on all their runs: held out by source, hence by every model
    and plan in them (issue 19: the published GPU fine-tuning sources).

    Default: the shipped predictor (or `bundle`), no refitting; a source its metadata lists among its training
    sources is refused, since it would not be held out. `refit`: fit the kernels on every probe and the bundle on
    every other source's runs first (what `perfpredict train` does without them: minutes), so the score holds after
    the shipped predictor is retrained with these sources in. Returns metrics per source (split "source") and per
    (source, model) (split "source:model"), each with the composition and the analytic estimate beside the learned
    result and the false-OOM rate, and the predictions."""
    from perfpredict.models.bundle import default_bundle

    if not sources:
        raise PerfPredictError("name the held-out source(s) to score, e.g. msswift_examples")
    if not refit:
        bundle = bundle or default_bundle()
        trained = set(bundle.metadata.get("sources") or ())
        seen = sorted(set(sources) & trained)
        if seen:
            raise PerfPredictError(f"source(s) {seen} are in the predictor's training data "
                                   f"({', '.join(sorted(trained))}), so they are not held out; add --refit to fit one "
                                   "without them (minutes)")
    runs = load_runs(data)
    present = set(runs["source"].unique().to_list())
    unknown = sorted(set(sources) - present)
    if unknown:
        raise PerfPredictError(f"no runs of source(s) {unknown} under {str(data)!r}; present: "
                               f"{', '.join(sorted(present))}")
    held = c("source").is_in(list(sources))
    if refit:
        (progress or (lambda m: None))(f"fitting without {', '.join(sources)}")
        bundle, _ = fit_bundle(runs.filter(~held), KernelModel(seed=seed).fit(load_probes(data)), seed=seed)
        bundle.metadata.update(variant=DEFAULT_VARIANT.name,
                               sources=sorted(set(runs.filter(~held)["source"].unique().to_list())))
    test = runs.filter(held)
    composed = bundle.compose(test)
    pred = composed.with_columns(**{k: pl.Series(v) for k, v in bundle.apply(composed).items()},
                                 split=pl.lit("source"), fold=c("source"),
                                 variant=pl.lit(str(bundle.metadata.get("variant", DEFAULT_VARIANT.name))))
    by_source = metrics(pred, ("variant", "split", "source"))
    by_model = metrics(pred.with_columns(split=pl.lit("source:model"),
                                         source=pl.concat_str([c("source"), c("m_name")], separator=":")),
                       ("variant", "split", "source"))
    return {"metrics": pl.concat([by_source, by_model], how="diagonal_relaxed"), "predictions": pred}


# Per-run columns `evaluate --held-out-source --json` records beside the metrics (docs/held-out-sources.json).
HELD_OUT_ROW_COLUMNS = ("source", "upstream_ref", "m_name", "g_name", "c_gpus", "p_framework", "p_zero", "p_tp",
                        "p_dp", "p_cp", "p_ep", "p_recompute", "w_objective", "w_seq_len", "w_global_batch",
                        "step_time_s", "pred_time_s", "k_step_s", "d_analytic_step_s", "peak_memory_gib",
                        "pred_mem_gib", "d_peak_logits_gib", "pred_fits", "note")


def held_out_records(res: dict) -> list[dict]:
    """What `evaluate --held-out-source --json` writes: the metric rows, then one row per run tagged
    {"table": "run"} (measured beside predicted, composed and analytic)."""
    pred = res["predictions"]
    cols = [k for k in HELD_OUT_ROW_COLUMNS if k in pred.columns]
    runs = pred.select(cols).sort("source", "upstream_ref").to_dicts()
    return res["metrics"].to_dicts() + [{"table": "run", **r} for r in runs]


def metrics_trl(pred: pl.DataFrame) -> pl.DataFrame:
    """TRL rows per (variant, split, trainer x reference mode), e.g. "dpo live", "dpo precomputed", "simpo none",
    and all TRL rows of a split together ("all")."""
    if "trl_mode" not in pred.columns:
        return pl.DataFrame()
    trl = pred.filter(c("trl_mode").is_not_null())
    if not trl.height:
        return pl.DataFrame()
    both = pl.concat([trl, trl.with_columns(trl_mode=pl.lit("all"))], how="diagonal_relaxed")
    return metrics(both, ("variant", "split", "trl_mode"))


def plot_predicted_vs_measured(pred: pl.DataFrame, path: Path | str) -> Path:
    """Predicted vs measured step time and peak memory, one colour per source, one column per split."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "variant" in pred.columns and pred["variant"].n_unique() > 1:  # one point per run: the shipped variant's
        pred = pred.filter(c("variant") == DEFAULT_VARIANT.name)
    sources = sorted(set(pred["source"].unique().to_list()))
    colour = {src: f"C{i}" for i, src in enumerate(sources)}  # one colour per source in every panel
    present = set(pred["split"].unique().to_list())
    splits = [s for s in SPLITS if s in present] + sorted(present - set(SPLITS))  # e.g. "source" (held-out sources)
    fig, axes = plt.subplots(2, len(splits), figsize=(4.2 * len(splits), 8.0), squeeze=False)
    for j, split in enumerate(splits):
        sub_split = pred.filter(c("split") == split)
        for i, (true, p, label, rows) in enumerate((("step_time_s", "pred_time_s", "step time (s)", time_rows),
                                                    ("peak_memory_gib", "pred_mem_gib", "peak memory (GiB)",
                                                     memory_rows))):
            ax = axes[i][j]
            sub = rows(sub_split)
            for (src,), g in sorted(sub.group_by("source"), key=lambda t: str(t[0])):
                ax.scatter(g[true], g[p], s=6, alpha=0.5, color=colour[src], label=f"{src} ({g.height})")
            if sub.height:
                lo = float(min(sub[true].min(), sub[p].min()))
                hi = float(max(sub[true].max(), sub[p].max()))
                ax.plot([lo, hi], [lo, hi], "k--", lw=1)
                ax.set_xscale("log")
                ax.set_yscale("log")
                ax.legend(fontsize=7)
            ax.set_xlabel(f"measured {label}")
            ax.set_ylabel(f"predicted {label}")
            ax.set_title(f"held out: {split}" + (" (test)" if split == "largest" else ""), fontsize=9)
    fig.suptitle("perfpredict: predicted vs measured on held-out splits")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def trl_baselines(*, data: Path | str, kernels: KernelModel | None = None,
                  launch_floor: dict[str, float] | None = None) -> pl.DataFrame:
    """A quick trl-shape table without the learned layer: the composition with each shape's TRL calibration fitted
    without that shape (and without the largest, test-partition shape), and the analytic memory and step
    estimates, per trainer x reference mode. `kernels` default: the shipped predictor's (no TRL row in them), with
    its launch floor; `launch_floor` None with other kernels: compose.LAUNCH_FLOOR_S."""
    from perfpredict.models.calibration import TrlCalibration
    from perfpredict.train.data import load_trl

    if kernels is None:
        from perfpredict.models.bundle import default_bundle

        kernels, launch_floor = default_bundle().kernels, launch_floor or default_bundle().launch_floor_s
    d = describe_trl(load_trl(data))
    largest = d["m_params"].max()
    t = time_rows(d)
    y, shape, params = t["step_time_s"].to_numpy(), t["m_name"].to_numpy(), t["m_params"].to_numpy()
    pred = np.full(len(y), np.nan)
    for s_ in np.unique(shape):
        te, tr = shape == s_, (shape != s_) & (params != largest)
        cal = TrlCalibration(kernels, launch_floor=launch_floor).fit(t.filter(pl.Series(tr)), y[tr])
        pred[te] = cal.predict(t.filter(pl.Series(te)))
    t = t.with_columns(_comp=pl.Series(pred))
    m = memory_rows(d)
    rows = []
    for mode in [*sorted(set(d["trl_mode"].to_list())), "all"]:
        tt = t if mode == "all" else t.filter(c("trl_mode") == mode)
        mm = m if mode == "all" else m.filter(c("trl_mode") == mode)
        rows.append({"trl_mode": mode, "time_n": tt.height,
                     "time_composed_mape": float(_ape(tt["_comp"].to_numpy(), tt["step_time_s"].to_numpy()).mean())
                     if tt.height else float("nan"),
                     "time_analytic_mape": float(_ape(tt["d_analytic_step_s"].to_numpy(),
                                                      tt["step_time_s"].to_numpy()).mean()) if tt.height else float("nan"),
                     "mem_n": mm.height,
                     "mem_analytic_mape": float(_ape(mm["d_mem_gib"].to_numpy(), mm["peak_memory_gib"].to_numpy()).mean())
                     if mm.height else float("nan")})
    return pl.DataFrame(rows)


def trl_host_baselines(*, data: Path | str, seed: int = 0) -> pl.DataFrame:
    """The trl-host split without the learned layer, quick (seconds): for each host with TRL rows, the TRL
    calibration trained on every other row (the ours-cpu runs and the other hosts' TRL rows, launch floor included),
    predicting the held-out host's TRL steps. Step time per variant of the TRL terms:
    - composed: the composition alone (no TRL calibration);
    - constants: the fitted constants (what shipped before TRL-op probes);
    - probes: the calibration with every host's TRL-op probes (models.trl_scales; a host without them, or too few
      probed hosts in training, falls back to the constants: `fallback` says why);
    - probe_ratios: each probed host's measured ratios alone (no residual fitted; null where it has no probes):
      how far the probed ops are from the step-level composition.
    Peak memory: the analytic estimate (d_mem_gib). bias = median(pred / measured - 1)."""
    from perfpredict.models.calibration import LaunchFloor, TrlCalibration
    from perfpredict.models.compose import compose
    from perfpredict.models.trl_scales import flat_scales, trl_probe_scales

    runs = load_runs(data)
    probes = load_probes(data)
    trl = runs.select(is_trl().fill_null(False) & on_cpu()).to_series()
    hosts = sorted(runs.filter(trl)["g_name"].unique().to_list())
    if len(hosts) < 2:
        raise PerfPredictError(f"TRL rows of {len(hosts)} host(s) under {str(data)!r} ({', '.join(hosts) or 'none'}); "
                               "leave-one-host-out needs two (`perfpredict collect trl` on another machine)")
    cpu_runs = runs.filter(on_cpu(c("g_name"))).drop([x for x in runs.columns if x.startswith(("k_", "kc_", "oof_"))])
    trl = cpu_runs.select(is_trl().fill_null(False)).to_series()
    cpu_hw = cpu_runs["g_name"].unique().to_list()
    kernels = KernelModel(seed=seed).fit(probes.filter(c("hardware").is_in(cpu_hw)))
    scales = trl_probe_scales(probes, kernels)
    rows = []
    for h in hosts:
        test_mask = (trl & (cpu_runs["g_name"] == h)).to_numpy()
        train, test = cpu_runs.filter(pl.Series(~test_mask)), cpu_runs.filter(pl.Series(test_mask))
        tr, te = time_rows(train), time_rows(test)
        y, yt = tr["step_time_s"].to_numpy(), te["step_time_s"].to_numpy()
        floor = LaunchFloor(kernels).fit(tr, y)
        const = TrlCalibration(kernels, launch_floor=floor.floors_).fit(tr, y)
        probed = TrlCalibration(kernels, launch_floor=floor.floors_, probe_scales=scales).fit(tr, y)
        preds = {"composed": compose(te, kernels, launch_floor=floor.floors_, canonical=False)["k_step_s"].to_numpy(),
                 "constants": const.predict(te), "probes": probed.predict(te)}
        if h in scales:
            raw = {**const.calibration_, **flat_scales({h: scales[h]})}
            preds["probe_ratios"] = compose(te, kernels, launch_floor=floor.floors_, trl_calibration=raw,
                                            canonical=False)["k_step_s"].to_numpy()
        mr = memory_rows(test)
        row: dict = {"held_out": h, "trained_on": ", ".join(x for x in hosts if x != h), "time_n": te.height,
                     "trl_op_probes": int(probes.filter((c("hardware") == h) & c("op").is_in(list(TRL_OPS))).height)}
        for name in ("composed", "constants", "probes", "probe_ratios"):
            r = preds[name] / yt - 1.0 if name in preds else np.full(len(yt), np.nan)
            row[f"time_{name}_mape"] = float(np.abs(r).mean())
            row[f"time_{name}_bias"] = float(np.median(r))
        row["fallback"] = probed.probe_fallback_
        row["mem_n"] = mr.height
        row["mem_analytic_mape"] = float(_ape(mr["d_mem_gib"].to_numpy(), mr["peak_memory_gib"].to_numpy()).mean())
        rows.append(row)
    return pl.DataFrame(rows)


def describe_trl(raw: pl.DataFrame) -> pl.DataFrame:
    from perfpredict.features.descriptors import describe

    return describe(raw).filter(c("outcome") == "ok").with_columns(
        trl_mode=trl_mode())


def check_selection(*, splits: list[str] | None = None, variants: list[str] | None = None
                    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The splits and correction variants to evaluate (default: all splits, the shipped variant), or one error
    naming the unknown ones and what is accepted."""
    from perfpredict.train.fit import DEFAULT_VARIANT, VARIANTS

    chosen_splits = tuple(splits or SPLITS)
    chosen_variants = tuple(variants or (DEFAULT_VARIANT.name,))
    bad = [s for s in chosen_splits if s not in SPLITS] + [v for v in chosen_variants if v not in VARIANTS]
    if bad:
        raise PerfPredictError(f"unknown split/variant {bad}; splits: {', '.join(SPLITS)}; "
                               f"variants: {', '.join(VARIANTS)}")
    return chosen_splits, chosen_variants


def metrics_records(res: dict) -> list[dict]:
    """What `evaluate --json` writes: the metric rows, then the TRL rows tagged {"table": "trl"}, then the
    trl-host split per held-out host tagged {"table": "trl-host"}."""
    trl, host = res.get("metrics_trl"), res.get("metrics_trl_host")
    return (res["metrics"].to_dicts()
            + ([{"table": "trl", **r} for r in trl.to_dicts()] if trl is not None and trl.height else [])
            + ([{"table": "trl-host", **r} for r in host.to_dicts()] if host is not None and host.height else []))
