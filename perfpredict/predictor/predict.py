"""Predictions for scenarios and plan frames, from a trained bundle. No torch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from perfpredict.core.errors import PerfPredictError
from perfpredict.core.scenario import Scenario
from perfpredict.core.schema import ENGINE_PARTS, FIT_COLUMNS, STEP_TIME_PARTS
from perfpredict.features.descriptors import describe
from perfpredict.models.bundle import Bundle, default_path

c = pl.col


@cache
def _load(path: str) -> Bundle:
    return Bundle.load(path)


def load_predictor(path: Path | str | None = None) -> Bundle:
    return _load(str(path or default_path()))


def _col(df: pl.DataFrame, name: str) -> np.ndarray:
    """A composed column, zeros where an older composition lacks it."""
    return df[name].to_numpy() if name in df.columns else np.zeros(df.height)


def predict_frame(flat: pl.DataFrame, *, bundle: Bundle | None = None, described: bool = False,
                  canon: tuple[pl.DataFrame, np.ndarray] | None = None) -> pl.DataFrame:
    """Flat scenario rows -> the same rows with descriptors, the composition and every prediction column (`canon`:
    their canonical plans described, models.compose.compose's)."""
    b = bundle or load_predictor()
    df = flat if described else describe(flat)
    df = b.compose(df, canon=canon)
    b.check_features(df)
    p = b.apply(df)
    t, mem = p["pred_time_s"], p["pred_mem_gib"]
    # Where a pipeline crosses nodes the measured runs are bimodal (models.stall): the step is the stall-free one
    # unless a stall is likely (then the stalled one), the interval covers both regimes and the throughput expected
    # over them is what `rank` orders by (expected_samples_per_s, models.stall.expected_steps_per_s). The
    # composition's parts scale with the stall-free ratio; the rest of the step is the stall (b_stall_s: the stall
    # where the point is the stalled step, or, for a bundle saved without a stall model, what the stall-free guard
    # leaves over).
    free = p["pred_free_time_s"]
    ratio = free / df["k_step_s"].to_numpy()
    mratio = mem / df["d_mem_gib"].to_numpy()
    tokens = df["d_tokens_per_step"].to_numpy()
    samples = df["w_global_batch"].to_numpy().astype(float)
    peak = np.where(df["w_precision"].to_numpy() == "fp32", df["g_fp32_tflops"].to_numpy(),
                    df["g_bf16_tflops"].to_numpy()) * 1e12
    mfu = df["d_model_flops_per_step"].to_numpy() / (t * peak * df["c_gpus"].to_numpy())
    out = df.with_columns(
        step_time_s=pl.Series(t), step_time_lo_s=pl.Series(p["pred_time_lo_s"]),
        step_time_hi_s=pl.Series(p["pred_time_hi_s"]),
        tokens_per_s=pl.Series(tokens / t), samples_per_s=pl.Series(samples / t),
        peak_memory_gib=pl.Series(mem), peak_memory_lo_gib=pl.Series(p["pred_mem_lo_gib"]),
        peak_memory_hi_gib=pl.Series(p["pred_mem_hi_gib"]),
        fits=pl.Series(p["pred_fits"]),
        stall_risk=pl.Series(p["pred_stall_p"]), stall_free_time_s=pl.Series(free),
        stalled_time_s=pl.Series(p["pred_stalled_time_s"]), expected_time_s=pl.Series(p["pred_expected_time_s"]),
        # without a stall risk exactly the point's throughput (one regime)
        expected_samples_per_s=pl.Series(np.where(p["pred_stall_p"] > 0, samples * p["pred_expected_steps_per_s"],
                                                  samples / t)),
        **{k: pl.Series(p[k]) for k in FIT_COLUMNS},
        # How much of the learned correction applies (1: inside the measured domain, 0: composition alone).
        time_applicability=pl.Series(p["time_weight"]), memory_applicability=pl.Series(p["mem_weight"]),
        mfu=pl.Series(mfu),
        # Host-bound time (dispatch, ZeRO-3 hooks the device cannot cover) counts with the compute it delays.
        b_compute_s=pl.Series((df["k_compute_s"] + df["k_launch_s"] + _col(df, "k_hook_s")).to_numpy() * ratio),
        b_tp_comm_s=pl.Series((df["k_tp_s"] + df["k_cp_s"] + df["k_ep_s"]).to_numpy() * ratio),
        b_dp_comm_s=pl.Series((df["k_dp_s"] + df["k_zero3_s"]).to_numpy() * ratio),
        b_pp_comm_s=pl.Series(df["k_pp_s"].to_numpy() * ratio),
        b_bubble_s=pl.Series(df["k_bubble_s"].to_numpy() * ratio),
        b_optimizer_s=pl.Series((df["k_optim_s"] + df["d_host_s"]).to_numpy() * ratio),
        # Engine terms inside those parts (models.compose), scaled alike, for --explain: the exposed ZeRO-3/FSDP
        # parameter gathers, DeepSpeed ZeRO-3's hooks, the exposed gradient reduction, recompute's and the
        # reference's forward work.
        e_zero3_gather_s=pl.Series(_col(df, "k_zero3_s") * ratio),
        e_zero3_hooks_s=pl.Series(_col(df, "k_hook_s") * ratio),
        e_grad_reduce_s=pl.Series(_col(df, "k_dp_s") * ratio),
        e_recompute_s=pl.Series(_col(df, "k_recompute_s") * ratio),
        e_reference_fwd_s=pl.Series(_col(df, "k_reference_s") * ratio),
        # transformers' eager layer ops on a GPU (fp32 RMSNorm chain, rotary, repeat_kv, copies; core.frameworks
        # HF_EAGER_LAYER), of the compute.
        e_hf_eager_s=pl.Series(_col(df, "k_hf_eager_s") * ratio),
        b_stall_s=pl.Series(t - free),
        # The peak rank's parts, scaled like its total: they add up to peak_memory_gib.
        mem_states_gib=pl.Series(df["d_peak_states_gib"].to_numpy() * mratio),
        mem_activations_gib=pl.Series(df["d_peak_act_gib"].to_numpy() * mratio),
        mem_logits_gib=pl.Series(df["d_peak_logits_gib"].to_numpy() * mratio),
        mem_reference_gib=pl.Series(df["d_peak_ref_gib"].to_numpy() * mratio),
        mem_other_gib=pl.Series(df["d_peak_other_gib"].to_numpy() * mratio),
    )
    parts = list(STEP_TIME_PARTS)
    names = ["compute", "TP communication", "DP communication", "pipeline communication", "pipeline bubble",
             "optimizer/offload", "pipeline stall risk"]
    dom = np.array(names)[np.argmax(out.select(parts).to_numpy(), axis=1)]
    return out.with_columns(dominant=pl.Series(dom))


# The engine terms --explain names (label -> column, core.schema ENGINE_PARTS), in models.compose's words.
ENGINE_TERMS = {"exposed ZeRO-3/FSDP gather": "e_zero3_gather_s", "ZeRO-3 hook overhead": "e_zero3_hooks_s",
                "exposed grad reduce-scatter/all-reduce": "e_grad_reduce_s", "recompute (of compute)": "e_recompute_s",
                "reference forward (of compute)": "e_reference_fwd_s",
                "transformers eager ops (of compute)": "e_hf_eager_s"}
assert tuple(ENGINE_TERMS.values()) == ENGINE_PARTS


def fit_line(row: dict) -> str:
    """How a plan's verdict was reached (the `--explain` memory line of `rank` and `predict`): the reserve outside
    the allocator, the peak's interval, the margin applied and the three-way rule (models.oom.verdict)."""
    usable = row["r_usable_gib"]
    return (f"Fit: {row['fit_verdict']}, P(OOM) {100 * row['oom_risk']:.1f}%. GPU {row['g_memory_gib']:.0f} GiB - "
            f"reserve {row['g_memory_gib'] - usable:.2f} (what CUDA keeps back {row['r_hidden_gib']:.2f}, CUDA context "
            f"{row['r_context_gib']:.2f}, NCCL buffers {row['r_nccl_gib']:.2f}) = {usable:.1f} GiB usable; peak "
            f"{row['peak_memory_gib']:.1f} [{row['peak_memory_lo_gib']:.1f}-{row['peak_memory_hi_gib']:.1f}] x "
            f"(1 + margin {row['oom_margin']:+.2f}) must stay within it: fits up to {row['fit_limit_gib']:.1f} GiB "
            "(margin: the interval's upper end, times the margin calibrated on held-out OOM outcomes for this "
            "framework family and GPU memory class where it has them). Three-way: fits when the peak x (1 + margin) "
            "stays within the usable memory; does not fit when even the interval's lower end exceeds it; at risk "
            "in between.")


@dataclass(frozen=True)
class Prediction:
    step_time_s: float
    tokens_per_s: float
    samples_per_s: float  # pairs per second for preference objectives
    peak_memory_gib: float
    host_ram_gib: float  # host RAM an offload plan's node pins (features.memory.host_memory); 0 without offload
    fits: bool
    mfu: float
    step_time_interval_s: tuple[float, float]
    peak_memory_interval_gib: tuple[float, float]
    breakdown: dict[str, float]
    dominant: str
    fit_verdict: str = "fits"  # fits / at risk / does not fit (models.oom); `fits` is fit_verdict == "fits"
    oom_risk: float = 0.0  # P(peak > the memory the allocator can use)
    fit_explanation: str = ""  # fit_line: the reserve, the margin applied and the three-way verdict
    # P(a cross-node pipeline stalls), the stall-free and the stalled step and their expectation (models.stall);
    # step_time_s is the stall-free step unless a stall is likely
    stall_risk: float = 0.0
    stall_free_time_s: float = 0.0
    stalled_time_s: float = 0.0
    expected_time_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _row_prediction(r: dict[str, Any]) -> Prediction:
    return Prediction(
        step_time_s=r["step_time_s"], tokens_per_s=r["tokens_per_s"], samples_per_s=r["samples_per_s"],
        peak_memory_gib=r["peak_memory_gib"], host_ram_gib=r["d_host_ram_node_gib"], fits=bool(r["fits"]), mfu=r["mfu"],
        step_time_interval_s=(r["step_time_lo_s"], r["step_time_hi_s"]),
        peak_memory_interval_gib=(r["peak_memory_lo_gib"], r["peak_memory_hi_gib"]),
        breakdown={"compute_s": r["b_compute_s"], "tp_comm_s": r["b_tp_comm_s"], "dp_comm_s": r["b_dp_comm_s"],
                   "pp_comm_s": r["b_pp_comm_s"], "bubble_s": r["b_bubble_s"], "optimizer_s": r["b_optimizer_s"],
                   "stall_s": r["b_stall_s"],
                   "states_gib": r["mem_states_gib"], "activations_gib": r["mem_activations_gib"],
                   "logits_gib": r["mem_logits_gib"], "reference_gib": r["mem_reference_gib"],
                   "other_gib": r["mem_other_gib"],
                   **{k[2:]: r[k] for k in ENGINE_TERMS.values() if k in r}},
        dominant=r["dominant"], fit_verdict=r["fit_verdict"], oom_risk=r["oom_risk"], stall_risk=r["stall_risk"],
        stall_free_time_s=r["stall_free_time_s"], stalled_time_s=r["stalled_time_s"],
        expected_time_s=r["expected_time_s"], fit_explanation=fit_line(r))


@dataclass(frozen=True)
class PredictionError:
    """Stands in place of a prediction for an invalid scenario (predict_many(..., errors="return"))."""

    error: str
    index: int

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.error, "index": self.index}


def _as_scenario(x: Any, i: int) -> Scenario:
    if isinstance(x, Scenario):
        return x
    if isinstance(x, dict):
        return Scenario.from_dict(x)
    raise PerfPredictError(f"scenario {i} must be a Scenario or its dict form, got {type(x).__name__}")


def predict_many(scenarios: Sequence[Scenario | dict], *, bundle: Bundle | None = None,
                 errors: str = "raise") -> list[Prediction | PredictionError]:
    """Predictions for many scenarios (Scenario objects or their dicts), in order, in one batch.

    Invalid entries: with errors="raise" (the default) nothing is predicted and one PerfPredictError names every bad
    index and why; with errors="return" each bad entry gets a PredictionError (error, index) in its place and every
    good one its Prediction. An empty sequence gives an empty list."""
    if errors not in ("raise", "return"):
        raise PerfPredictError(f"errors must be 'raise' or 'return', got {errors!r}")
    if isinstance(scenarios, (str, bytes, dict, Scenario)) or not isinstance(scenarios, Sequence):
        raise PerfPredictError(f"predict_many takes a list of scenarios, got {type(scenarios).__name__}")
    parsed: list[Scenario | PredictionError] = []
    for i, x in enumerate(scenarios):
        try:
            parsed.append(_as_scenario(x, i))
        except PerfPredictError as e:
            parsed.append(PredictionError(str(e), i))
    bad = [p for p in parsed if isinstance(p, PredictionError)]
    if bad and errors == "raise":
        shown = "; ".join(f"[{b.index}] {b.error}" for b in bad[:5])
        more = f"; and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise PerfPredictError(f"{len(bad)} of {len(parsed)} scenarios are invalid: {shown}{more}")
    good = [p for p in parsed if isinstance(p, Scenario)]
    preds = iter(_predict_scenarios(good, bundle) if good else [])
    return [p if isinstance(p, PredictionError) else next(preds) for p in parsed]


def _predict_scenarios(scenarios: list[Scenario], bundle: Bundle | None) -> list[Prediction]:
    df = predict_frame(pl.DataFrame([s.to_flat() for s in scenarios]), bundle=bundle)
    return [_row_prediction(r) for r in df.iter_rows(named=True)]


def predict(scenario: Scenario | dict, *, bundle: Bundle | None = None) -> Prediction:
    """One prediction: step time, tokens/s, samples/s (pairs/s for preference objectives), peak memory, fits,
    intervals and the breakdown. Accepts a Scenario or its dict form (model may be a catalog name)."""
    if not isinstance(scenario, (Scenario, dict)):
        raise PerfPredictError(f"predict takes one scenario (a Scenario or its dict form), got "
                               f"{type(scenario).__name__}; for many use predict_many")
    return _predict_scenarios([_as_scenario(scenario, 0)], bundle)[0]
