"""End-to-end check of the silicon composition (models.generate.engine) on measured serving runs:
datasets/public/aiconfigurator_e2e/runs.csv (NVIDIA AIConfigurator's silicon_sample, aggregated runs: TTFT and TPOT
of vLLM, SGLang and TensorRT-LLM at a stated concurrency, TP and EP; SOURCE.md there).

Each run is predicted from the kernels measured on its GPU: concurrency c held in a closed loop (the benchmark's
fixed concurrency), isl / osl, chunked prefill at 8,192 batched tokens (vLLM serve, SGLang chunked_prefill_size and
TensorRT-LLM max_num_tokens defaults on these GPUs); SGLang at its defaults prefills first, so its benchmark runs in
waves (engine.prefill_first_waves; prefill_first_runs says which runs). Per-GPU decode throughput = c / TPOT /
(tp x pp), as the source's notes say (steady state).

Splits hold out one model, one GPU type or one backend at a time. The composition has no fitted part; the learned
correction (fitted on the training rows of the split) is a TPOT scale per backend and dense/MoE, and for TTFT four
terms pooled over the backends (grouped returns, opening burst, a fixed time, a host time per running stream; a
prefill-first run's composed TTFT enters unscaled, beside the last two); each is used only where it lowers the
held-out error on every split (else the composition stands).

Layout choice: groups = (backend, model, GPU, weight format, isl, osl) with >= 2 TP degrees measured; a layout's
value is its best per-GPU throughput over the concurrencies measured for it; the prediction picks the TP with the
best predicted value at the same concurrencies, the rule of thumb the smallest TP whose weights and one request's
KV fit, the roofline the best roofline value."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from perfpredict.core.catalog import get_gpu, get_model
from perfpredict.core.errors import PerfPredictError
from perfpredict.core.model import ModelSpec
from perfpredict.features.generate import kv_capacity
from perfpredict.models.generate.engine import (
    BatchWait,
    Parallel,
    batch_wait_ttft_s,
    benchmark_ttft,
    host_step_overhead_s,
    prefill_first_waves,
    roofline_tpot,
    steady_state,
)
from perfpredict.models.generate.silicon import SiliconKernels, covered_gpus

E2E = Path("public") / "aiconfigurator_e2e"
SYSTEM_GPU = {"h100_sxm": "h100-sxm-80gb", "h200_sxm": "h200-sxm-141gb", "b200_sxm": "b200", "b300_sxm": "b300",
              "gb200": "gb200", "gb300": "gb300", "a100_sxm": "a100-sxm-80gb", "l40s": "l40s",
              "rtx_pro_6000_server": "rtx-pro-6000"}
QUANT = {None: "bfloat16", "fp8": "fp8", "fp8_block": "fp8_block"}
BATCHED_TOKENS = 8192
# Engines whose scheduler runs a waiting prompt's prefill before any decode step (SGLang: Scheduler.
# get_next_batch_to_run, "Run prefill first if possible"); vLLM and TensorRT-LLM mix prompt chunks into decode steps.
PREFILL_FIRST = {"sglang"}
# ...at their defaults. AIConfigurator's generated configurations turn SGLang's mixed chunks on
# (src/aiconfigurator/generator/rule_plugin/benchmark/sglang.rule: `agg enable_mixed_chunk = true`,
# `agg_prefill_decode max_prefill_tokens = SlaConfig.isl + 1500`), so its prefill chunks ride in decode batches
# (get_new_batch_prefill, "Mixed-style chunked prefill": new_batch.mix_with_running) as vLLM's do. Which runs used
# one is not stated; read from the grid (prefill_first_runs): a gap-analysis configuration measured at a single
# concurrency is the generator's pick of max_batch_size (the SGLang 0.5.6 runs, isl 1,000-8,000, one concurrency
# each), a sweep over concurrencies (the SGLang 0.5.1 Qwen3-32B runs, 16-128 at isl 1,024-4,096) the engine at its
# defaults. Their measured TPOT agrees: the mixed composition fits the single-point runs (18.7 % vs 27.8 % as prefill-
# first waves), the prefill-first waves the sweeps (9.0 % vs 22.4 %; docs/generate-accuracy.md, seventh pass).
GENERATED_HARNESSES = {"gap-analysis"}
# The client each run's harness used (runs.csv `harness`, from the source's provenance text; docs/generate-accuracy.md,
# issue 20 sixth pass). InferenceX's runs (its database dump and CSV exports) come from vLLM's benchmark_serving.py
# at `--num-prompts 10c --max-concurrency c --random-range-ratio` (SemiAnalysisAI/InferenceX benchmarks/single_node/
# minimaxm2.5_fp8_b200.sh, benchmarks/70b_fp8_h200_slurm.sh; NVIDIA replays them with random_range_ratio 0.8 and
# 10c requests, ai-dynamo/aisimulate scripts/e2e_accuracy/run_e2e_accuracy.py replay_spec): lengths drawn per
# request, so requests finish out of step and a new one meets the running set at a random point of its decode, the
# random-arrival steady state (SteadyState.ttft_s). NVIDIA's gap-analysis runs state no client; AIConfigurator's own
# benchmark scripts run AIPerf with fixed lengths (tests/baseline/precutover_ref/sglang_dense_agg/bench_run.sh:
# --isl-stddev 0 --osl-stddev 0), taken for them: the grouped returns (SteadyState.wave_ttft_s).
RANDOM_LENGTH_HARNESSES = {"inferencex"}


@dataclass(frozen=True)
class RunEngine:
    """What a run's harness set beside the engine's defaults: the token budget per step (max_num_batched_tokens /
    max_num_tokens / chunked_prefill_size), the KV cache format decode attention reads (None: replica_kv's
    assumption) and TensorRT-LLM's batch waiting."""

    max_num_tokens: int = BATCHED_TOKENS
    kv_dtype: str | None = None
    batch_wait: BatchWait | None = None


# InferenceX served Llama-3.1-70B FP8 on vLLM with `kv-cache-dtype: fp8`, `max-num-batched-tokens: 8192` (config.yaml
# of benchmarks/70b_fp8_h100_slurm.sh lines 19-23, 70b_fp8_h200_slurm.sh 33-37, 70b_fp8_b200_docker.sh 26-31 at
# 9596d23d7), and on TensorRT-LLM, when these runs were measured (2025-10-29), with
# `trtllm-serve --max_num_tokens 16384` and an options file of `kv_cache_config: dtype: fp8`, and for 1k / 1k below
# TP8 `batch_wait_max_tokens_ratio: 0.9`, `batch_wait_timeout_iters: 20` ("For 1k/1k, use batch_wait_max_tokens_ratio
# and batch_wait_timeout_iters will improve the performance"): SemiAnalysisAI/InferenceX
# benchmarks/70b_fp8_h200_trt_slurm.sh lines 24-49 and benchmarks/70b_fp8_b200_trt_slurm.sh lines 27-53 at 9596d23d7
# (2025-10-29, the last commit before the 70B scripts were removed).
INFERENCEX_TRTLLM = RunEngine(max_num_tokens=16384, kv_dtype="fp8")
INFERENCEX_TRTLLM_1K1K = RunEngine(max_num_tokens=16384, kv_dtype="fp8", batch_wait=BatchWait(timeout_iters=20,
                                                                                                max_tokens_ratio=0.9))


INFERENCEX_VLLM = RunEngine(kv_dtype="fp8")
INFERENCEX_70B = "meta-llama/Llama-3.1-70B"


# AIConfigurator's generator gives an aggregated vLLM or TensorRT-LLM worker a token budget of max_batch_size +
# isl + 1,500 (ai-dynamo/aiconfigurator src/aiconfigurator/generator/rule_plugin/benchmark/vllm.rule line 12 and
# trtllm.rule line 11, `agg max_num_tokens`), the benchmark's concurrency being its max_batch_size
# (BenchConfig.estimated_concurrency = agg_workers x max_batch_size): vLLM chunks prompts at that budget as the
# composition does. SGLang's generated max_prefill_tokens = isl + 1,500 (benchmark/sglang.rule) is a different
# limit (PrefillAdder admits whole prompts while it lasts, beside chunked_prefill_size), not modelled: its generated
# runs keep the default budget.
GENERATED_BUDGET_EXTRA_TOKENS = 1500


def run_engine(r: dict[str, Any]) -> RunEngine:
    """The engine options the run's harness stated (RunEngine); the defaults where it states none."""
    if r.get("generated") and r["backend"] != "sglang":
        return RunEngine(max_num_tokens=int(r["batch_size"]) + int(r["isl"]) + GENERATED_BUDGET_EXTRA_TOKENS)
    if r.get("harness") != "inferencex" or r["model_path"] != INFERENCEX_70B:
        return RunEngine()
    if r["backend"] == "vllm":
        return INFERENCEX_VLLM
    if r["backend"] == "trtllm":
        if r["isl"] == 1024 and r["osl"] == 1024 and int(r["tp_size"]) < 8:
            return INFERENCEX_TRTLLM_1K1K
        return INFERENCEX_TRTLLM
    return RunEngine()


def model_specs(data: Path) -> dict[str, ModelSpec]:
    raw = json.loads((data / E2E / "models.json").read_text())
    out = {}
    for hf, v in raw.items():
        if isinstance(v, str):
            out[hf] = get_model(v)
        else:
            out[hf] = ModelSpec.from_dict({k: x for k, x in v.items() if k != "source"})
    return out


def load_runs(data: Path | str) -> tuple[pl.DataFrame, dict[str, int]]:
    """The runs the composition can describe, and the count of the rest by reason."""
    data = Path(data)
    f = data / E2E / "runs.csv"
    if not f.is_file():
        raise PerfPredictError(f"{f} not found: the silicon runs ship in datasets/public/aiconfigurator_e2e/")
    df = pl.read_csv(f)
    specs = model_specs(data)
    gpus = covered_gpus()
    skipped: dict[str, int] = {}

    def skip(mask: pl.Expr, why: str) -> None:
        nonlocal df
        n = df.filter(mask).height
        if n:
            skipped[why] = skipped.get(why, 0) + n
        df = df.filter(~mask)

    skip(~pl.col("model_path").is_in(list(specs)), "model not described (MLA attention: DeepSeek, Kimi, GLM-5; "
                                                     "gpt-oss sliding window + MXFP4; NVFP4 checkpoints)")
    skip(~pl.col("system").replace_strict(SYSTEM_GPU, default="").is_in(list(gpus)),
         "GPU without measured kernels")
    skip(pl.col("source_kind") == "dynamo", "Dynamo deployment: concurrency over an unstated number of workers")
    skip(~pl.col("gemm_quant_mode").fill_null("bf16").is_in(["bf16", "fp8", "fp8_block"]),
         "weight format without measured GEMMs (NVFP4, INT4)")
    skip(pl.col("attention_dp_size").fill_null(1) > 1, "attention data parallel")
    skip(pl.col("pp_size").fill_null(1) > 1, "pipeline parallel")
    df = df.with_columns(gpu=pl.col("system").replace_strict(SYSTEM_GPU, default=""),
                         gpus=pl.col("tp_size") * pl.col("pp_size").fill_null(1),
                         is_moe=pl.col("model_path").replace_strict({k: v.is_moe for k, v in specs.items()},
                                                                     default=False))
    return df.with_columns(prefill_first=prefill_first_runs(df), generated=generated_runs(df)), skipped


def generated_runs(df: pl.DataFrame) -> pl.Series:
    """Per run: is it a configuration AIConfigurator's generator picked (GENERATED_HARNESSES whose engine, version,
    model and GPU measured every (isl, osl, TP) configuration at one concurrency only)?"""
    keys = ["backend", "backend_version", "model_path", "system"]
    per_config = pl.col("batch_size").n_unique().over(*keys, "isl", "osl", "tp_size")
    d = df.select(sweep=(per_config.max().over(*keys) > 1),
                  generated=pl.col("harness").is_in(list(GENERATED_HARNESSES)))
    return (d["generated"] & ~d["sweep"]).alias("generated")


def prefill_first_runs(df: pl.DataFrame) -> pl.Series:
    """Per run: does its engine run prefill batches before decode steps (PREFILL_FIRST at its defaults), i.e. not
    a generated configuration (generated_runs)?"""
    return (df["backend"].is_in(list(PREFILL_FIRST)) & ~generated_runs(df)).alias("prefill_first")


@dataclass(frozen=True)
class RunPrediction:
    tpot_s: float
    ttft_s: float
    roofline_tpot_s: float
    steps: float  # engine steps per output token (for the overhead term): 1


def parallel_of(r: dict[str, Any], m: ModelSpec, kv_dtype: str | None = None) -> Parallel:
    q = QUANT.get(r["gemm_quant_mode"], "bfloat16")
    mq = QUANT.get(r.get("moe_quant_mode"), q)
    ep = int(r.get("moe_ep_size") or 1) or 1
    mtp = int(r.get("moe_tp_size") or 0)
    return Parallel(tp=int(r["tp_size"]), pp=int(r.get("pp_size") or 1), moe_tp=mtp if mtp > 0 else 0,
                    moe_ep=ep, gemm_dtype=q, moe_dtype=mq, kv_dtype=kv_dtype or "bfloat16")


def predict_runs(df: pl.DataFrame, data: Path) -> pl.DataFrame:
    """Composition-only TPOT / TTFT (seconds; host time per step only where the engine's version leaves it between
    GPU steps: engine.host_step_overhead_s) and the roofline TPOT."""
    specs = model_specs(data)
    out = []
    for r in df.iter_rows(named=True):
        m = specs[r["model_path"]]
        gpu = get_gpu(r["gpu"])
        k = SiliconKernels.for_gpu(r["gpu"])
        eng = run_engine(r)
        par = parallel_of(r, m, eng.kv_dtype)
        cap = replica_kv(m, r)
        s = steady_state(k, m, gpu, par, concurrency=r["batch_size"], input_len=r["isl"], output_len=r["osl"],
                         max_num_batched_tokens=eng.max_num_tokens, engine=r["backend"],
                         overhead_s=host_step_overhead_s(r["backend"], r["backend_version"]),
                         kv_pool_tokens=cap.pool_tokens if cap.fits else None)
        roof = roofline_tpot(m, gpu, par, concurrency=r["batch_size"], input_len=r["isl"], output_len=r["osl"])
        # The benchmark stepped as the engine schedules it (AIPerf's 20 rounds, vLLM's chunked budget, SGLang's
        # prefill-first batches): reported beside the grouped returns (ttft_ratios), not used as the TTFT: it
        # removes the per-backend bias but not the spread, and lost on held-out splits (docs/generate-accuracy.md).
        # It steps the running requests (KV- or max_num_seqs-limited); a queue beyond them is not stepped. Prefill-
        # first where the run is (its prefill_first column, as the TTFT below reads it): a generated SGLang
        # configuration mixes its chunks into decode steps.
        bench = benchmark_ttft(concurrency=s.concurrency, prompt=r["isl"], output_len=r["osl"],
                               budget_tokens=eng.max_num_tokens, decode_step_s=s.decode_tpot_s,
                               prefill_token_s=s.prefill_per_prompt_s * par.pp / r["isl"],
                               prefill_first=bool(r.get("prefill_first")))
        # TTFT composed as the benchmark runs: with fixed isl / osl at a fixed concurrency the requests come back
        # in the groups the opening burst formed (engine.wave_ttft); with lengths drawn per request (InferenceX's
        # client) they run out of step, the random-arrival steady state (RANDOM_LENGTH_HARNESSES); on an engine
        # that prefills first (prefill_first_runs) every round is the opening burst (engine.prefill_first_waves),
        # and the burst's prefill lands in the client's TPOT too.
        ttft, tpot = s.ttft_s if r.get("harness") in RANDOM_LENGTH_HARNESSES else s.wave_ttft_s, s.tpot_s
        if eng.batch_wait is not None and r.get("harness") in RANDOM_LENGTH_HARNESSES:
            # TensorRT-LLM holds a new prompt back until more arrive or the timeout passes (engine.BatchWait).
            ttft = batch_wait_ttft_s(s, eng.batch_wait, prompt=r["isl"], output_len=r["osl"],
                                     max_num_tokens=eng.max_num_tokens)
        if r.get("prefill_first"):
            ttft, tpot = prefill_first_waves(s, r["osl"])
        out.append({"fits": cap.fits, "running": s.concurrency, "pred_tpot_s": tpot,
                    "decode_tpot_s": s.decode_tpot_s, "wave_ttft_s": s.first_wave_s, "grouped_ttft_s": s.wave_ttft_s,
                    "pred_ttft_s": ttft,
                    "random_ttft_s": s.ttft_s, "burst_ttft_s": s.burst_ttft_s, "roof_tpot_s": roof,
                    "prefill_steps": s.prefill_steps, "bench_ttft_s": bench,
                    "prefill_token_s": s.prefill_per_prompt_s * par.pp / r["isl"]})
    return pl.concat([df, pl.DataFrame(out)], how="horizontal")


def replica_kv(m: ModelSpec, r: dict[str, Any]):
    """The replica's KV pool as vLLM serve 0.19 sizes it (utilisation 0.9; SGLang's and TensorRT-LLM's defaults,
    0.88 static and 0.9 free memory, are close). Assumed: FP8 checkpoints run an FP8 KV cache (AIConfigurator's
    FP8 configurations quantise the KV cache too; the runs do not state it)."""
    q = r["gemm_quant_mode"] or "bf16"
    return kv_capacity(m, get_gpu(r["gpu"]), tp=int(r["tp_size"]), pp=int(r.get("pp_size") or 1),
                       max_model_len=int(r["isl"] + r["osl"]), dtype="fp8" if q.startswith("fp8") else "bf16",
                       kv_cache_dtype="fp8" if q.startswith("fp8") else "auto",
                       fp8_scales="block" if q == "fp8_block" else "channel", vllm_version="0.19.0",
                       entrypoint="serve")


# --- the learned correction ----------------------------------------------------------------------------------------
# Per (backend, dense or MoE): TPOT = a x composed TPOT (a: the median measured / composed ratio);
# TTFT = u x grouped-return TTFT + w x all-at-once TTFT + c + h x running streams (w: the share of a benchmark's
# requests in its opening burst, c: the front end's fixed time, tokenising and HTTP, h: host time per concurrent
# stream; none is stated by the source), pooled over the backends (per backend it lost held out by model and GPU:
# 56 / 57 % dense vs 47 / 42 %), fitted by least absolute relative error (the reported metric; least squares:
# 51 / 44 %), all terms >= 0. h: a new request's first token leaves the server in the output batch of its step,
# behind the other running requests' outputs (vLLM: the API server's OutputProcessor handles a step's outputs one
# request at a time, vllm/v1/engine/output_processor.py OutputProcessor.process_outputs, `for engine_core_output in
# engine_core_outputs`), and the client reads c streams; a time per stream, independent of the GPU. It lowers
# held-out TTFT on every split (issue 20, fifth pass: docs/generate-accuracy.md).
Correction = dict[tuple[str, bool], tuple[float, ...]]
N_TERMS = 6


def _nnls_rel(cols: list[np.ndarray], y: np.ndarray, offset: np.ndarray | None = None) -> list[float]:
    from scipy.optimize import nnls

    A = np.stack([c / y for c in cols], axis=1)
    x, _ = nnls(A, 1 - (0 if offset is None else offset / y))
    return [float(v) for v in x]


def _l1_rel(cols: list[np.ndarray], y: np.ndarray, offset: np.ndarray | None = None) -> list[float]:
    """Non-negative x minimising sum |(A x + offset) / y - 1| (a linear programme: x >= 0 and one slack
    e_i >= |residual_i| per row). offset: a fixed, unfitted part of each prediction. A column that is zero on every
    row (a term the rows do not exercise) gets 0."""
    from scipy.optimize import linprog

    used = [i for i, c in enumerate(cols) if np.any(c != 0)]
    A = np.stack([cols[i] / y for i in used], axis=1)
    b = 1 - (0 if offset is None else offset / y)
    n, k = A.shape
    eye = np.eye(n)
    r = linprog(np.r_[np.zeros(k), np.ones(n)], A_ub=np.block([[A, -eye], [-A, -eye]]),
                b_ub=np.r_[b, -b], bounds=[(0, None)] * (k + n), method="highs")
    x = r.x[:k] if r.success else _nnls_rel([cols[i] for i in used], y, offset)
    out = [0.0] * len(cols)
    for i, v in zip(used, x, strict=True):
        out[i] = float(v)
    return out


def _ttft_terms_of(d: pl.DataFrame) -> tuple[list[np.ndarray], np.ndarray]:
    """The TTFT correction's columns (composed TTFT, all-at-once burst, 1, running streams) and its fixed part.
    Where the engine prefills first (column prefill_first) the composed TTFT is already the burst of every round:
    it enters at weight 1, unscaled, and without the opening-burst term; the front end's terms (fixed, per stream)
    are shared."""
    lock = d["prefill_first"].to_numpy() if "prefill_first" in d.columns else np.zeros(d.height, dtype=bool)
    free = (~lock).astype(float)
    base = d["pred_ttft_s"].to_numpy()
    return ([base * free, d["burst_ttft_s"].to_numpy() * free, np.ones(d.height), d["running"].to_numpy()],
            base * lock)


def fit_correction(df: pl.DataFrame) -> Correction:
    """TPOT per (backend, dense/MoE), and over all backends under "*" for a backend the rows lack; TTFT over all
    backends."""
    def ttft_terms(d: pl.DataFrame) -> list[float]:
        cols, fixed = _ttft_terms_of(d)
        return _l1_rel(cols, d["silicon_ttft_ms"].to_numpy() / 1e3, fixed)

    def tpot_scale(d: pl.DataFrame) -> float:
        return float(np.exp(np.median(np.log(d["silicon_tpot_ms"].to_numpy() / 1e3 / d["pred_tpot_s"].to_numpy()))))

    out: Correction = {}
    pooled = ttft_terms(df)
    for moe in (False, True):
        d = df.filter(pl.col("is_moe") == moe)
        if d.height:
            # An intercept fitted beside the TPOT scale traded the slope for a constant and lost held out.
            out[("*", moe)] = (tpot_scale(d), 0.0, *pooled)
    for (be, moe), d in df.group_by("backend", "is_moe"):
        out[(be, bool(moe))] = (tpot_scale(d), 0.0, *pooled)
    return out


def _lookup(corr: Correction, be: str, moe: bool) -> tuple[float, ...]:
    """The group's terms; a backend or kind the training rows lack takes the pooled fit."""
    if (be, moe) in corr:
        return corr[(be, moe)]
    if ("*", moe) in corr:
        return corr[("*", moe)]
    return next(iter(corr.values()))


def apply_correction(df: pl.DataFrame, corr: Correction | None) -> pl.DataFrame:
    if not corr:
        return df.with_columns(tpot_s=pl.col("pred_tpot_s"), ttft_s=pl.col("pred_ttft_s"))
    terms = np.array([_lookup(corr, be, bool(m)) for be, m in zip(df["backend"], df["is_moe"], strict=True)])
    terms = terms.reshape(-1, N_TERMS)
    cols, fixed = _ttft_terms_of(df)
    ttft = fixed + sum(c * terms[:, 2 + i] for i, c in enumerate(cols))
    return df.with_columns(tpot_s=pl.col("pred_tpot_s") * terms[:, 0] + terms[:, 1], ttft_s=pl.Series(ttft))


def _mape(pred: np.ndarray, meas: np.ndarray) -> float:
    return float(np.mean(np.abs(pred / meas - 1))) if len(meas) else float("nan")


def errors(df: pl.DataFrame) -> dict[str, Any]:
    """MAPE of TPOT, TTFT and per-GPU decode throughput (c / TPOT / GPUs), dense and MoE apart."""
    res: dict[str, Any] = {"rows": df.height}
    for name, sub in (("all", df), ("dense", df.filter(~pl.col("is_moe"))), ("moe", df.filter(pl.col("is_moe")))):
        if sub.height == 0:
            continue
        tp_meas = sub["silicon_tpot_ms"].to_numpy() / 1e3
        tp_pred = sub["tpot_s"].to_numpy()
        res[name] = {"rows": sub.height, "tpot_mape": _mape(tp_pred, tp_meas),
                     "ttft_mape": _mape(sub["ttft_s"].to_numpy(), sub["silicon_ttft_ms"].to_numpy() / 1e3),
                     "throughput_mape": _mape(1 / tp_pred, 1 / tp_meas),
                     "roofline_throughput_mape": _mape(1 / sub["roof_tpot_s"].to_numpy(), 1 / tp_meas)}
    return res


# --- layout choice --------------------------------------------------------------------------------------------------
GROUP = ("backend", "model_path", "gpu", "gemm_quant_mode", "isl", "osl")


def rule_of_thumb_tp(m: ModelSpec, gpu_name: str, tps: list[int], *, isl: int, osl: int, quant: str) -> int:
    """The smallest TP whose weights and one request of isl + osl fit vLLM's KV sizing (utilisation 0.9)."""
    gpu = get_gpu(gpu_name)
    for t in sorted(tps):
        if m.heads % t:
            continue
        cap = kv_capacity(m, gpu, tp=t, max_model_len=isl + osl, dtype="fp8" if quant.startswith("fp8") else "bf16",
                          vllm_version="0.19.0", entrypoint="serve",
                          fp8_scales="block" if quant == "fp8_block" else "channel")
        if cap.fits:
            return t
    return max(tps)


def layout_choice(df: pl.DataFrame, data: Path) -> dict[str, Any]:
    specs = model_specs(data)
    d = df.with_columns(meas_tps=pl.col("batch_size") * 1e3 / pl.col("silicon_tpot_ms") / pl.col("gpus"),
                        pred_tps=pl.col("batch_size") / pl.col("tpot_s") / pl.col("gpus"),
                        roof_tps=pl.col("batch_size") / pl.col("roof_tpot_s") / pl.col("gpus"))
    per = d.group_by(*GROUP, "tp_size").agg(pl.col("meas_tps").max(), pl.col("pred_tps").max(),
                                           pl.col("roof_tps").max())
    cases = []
    for key, g in per.group_by(*GROUP):
        if g.height < 2:
            continue
        r0 = dict(zip(GROUP, key, strict=True))
        best = g["meas_tps"].max()
        by_tp = {int(t): v for t, v in zip(g["tp_size"], g["meas_tps"], strict=True)}
        # Ties (the roofline's compute bound is often equal across TP) go to the smaller TP, so the pick does not
        # depend on the order polars' group_by returns.
        pick = int(g.sort(["pred_tps", "tp_size"], descending=[True, False])["tp_size"][0])
        roof = int(g.sort(["roof_tps", "tp_size"], descending=[True, False])["tp_size"][0])
        rule = rule_of_thumb_tp(specs[r0["model_path"]], r0["gpu"], list(by_tp), isl=r0["isl"], osl=r0["osl"],
                                quant=r0["gemm_quant_mode"] or "bf16")
        cases.append({**r0, "tps": sorted(by_tp), "best_tp": max(by_tp, key=by_tp.get), "pred_tp": pick,
                      "rule_tp": rule, "roof_tp": roof,
                      "pred_regret": 1 - by_tp[pick] / best, "rule_regret": 1 - by_tp[rule] / best,
                      "roof_regret": 1 - by_tp[roof] / best})
    if not cases:
        return {"groups": 0}
    c = pl.DataFrame(cases)
    out = {"groups": c.height}
    for who in ("pred", "rule", "roof"):
        out[f"{who}_within_5pct"] = float((c[f"{who}_regret"] <= 0.05).mean())
        out[f"{who}_mean_regret"] = float(c[f"{who}_regret"].mean())
    out["cases"] = c.to_dicts()
    return out


# --- held-out splits ------------------------------------------------------------------------------------------------
SPLITS = {"model": "model_path", "gpu": "gpu", "backend": "backend"}


def evaluate_silicon(data: Path | str = "datasets") -> dict[str, Any]:
    """Held-out errors by model, GPU and backend, composition alone and with the correction; layout choice."""
    data = Path(data)
    df, skipped = load_runs(data)
    df = predict_runs(df, data)
    # Faster than reading the layout's weights (and KV) once per token at full HBM bandwidth cannot be: the run's
    # stated TP does not describe the GPUs it used (e.g. Qwen3-235B FP8 at TP1 on one 141 GB H200).
    bad = (pl.col("silicon_tpot_ms") / 1e3 < 0.9 * pl.col("roof_tpot_s")) | ~pl.col("fits")
    n_bad = df.filter(bad).height
    if n_bad:
        skipped["stated layout cannot hold the weights or is faster than reading them (layout misreported)"] = n_bad
    df = df.filter(~bad)
    comp = apply_correction(df, None)
    res: dict[str, Any] = {"rows": df.height, "skipped": skipped, "composition": errors(comp),
                           "layout_composition": _strip(layout_choice(comp, data)), "splits": []}
    # The composition fits nothing on these rows, so its held-out error is its error on each group; the
    # correction is refitted without the group it is scored on.
    better: dict[str, list[bool]] = {"tpot": [], "ttft": []}
    preds: dict[str, pl.DataFrame] = {}
    for split, col in SPLITS.items():
        parts = []
        for g in df[col].unique().sort().to_list():
            test = df.filter(pl.col(col) == g)
            train = df.filter(pl.col(col) != g)
            corr = fit_correction(train) if train.height else None
            parts.append(apply_correction(test, corr))
            res["splits"].append({"split": split, "held_out": str(g), "composition": errors(comp.filter(
                pl.col(col) == g)), "corrected": errors(parts[-1])})
        pred = preds[split] = pl.concat(parts)
        e_c, e_k = errors(comp), errors(pred)
        better["tpot"].append(all(e_k[kind]["throughput_mape"] < e_c[kind]["throughput_mape"]
                                  for kind in ("dense", "moe") if kind in e_c))
        better["ttft"].append(all(e_k[kind]["ttft_mape"] < e_c[kind]["ttft_mape"] for kind in ("dense", "moe")
                                  if kind in e_c))
        res[f"held_out_{split}"] = {"errors": e_k, "layout": _strip(layout_choice(pred, data))}
    res["prefill_bound"] = prefill_bound(comp)
    res["ttft_ratio"] = ttft_ratios(comp)
    res["correction_all_rows"] = {f"{k[0]}/{'moe' if k[1] else 'dense'}": v for k, v in fit_correction(df).items()}
    # Used only where it lowers the held-out error on every split, dense and MoE alike: per quantity.
    res["correction_used"] = used = {k: all(v) for k, v in better.items()}
    # The errors of what is used, per held-out split: the correction's where it is used, else the composition's
    # (with the TPOT correction unused, held-out throughput is the composition's, not the corrected column's).
    for split, pred in preds.items():
        as_used = comp.sort("id").with_columns(
            tpot_s=(pred.sort("id")["tpot_s"] if used["tpot"] else pl.col("tpot_s")),
            ttft_s=(pred.sort("id")["ttft_s"] if used["ttft"] else pl.col("ttft_s")))
        res[f"held_out_{split}"]["as_used"] = errors(as_used)
    return res


def prefill_bound(comp: pl.DataFrame) -> dict[str, Any]:
    """Runs whose measured request life (TTFT + (osl - 1) x TPOT) is shorter than the composed time to prefill the
    run's c prompts alone, in full-budget steps with no decode beside them (the engine's first_wave_s): a closed
    loop of fresh prompts would then need more prefill per second than the GPU's measured kernels give. Reported,
    not removed: the source does not say why (a prefix-cache hit on repeated prompts would lower both TTFT and the
    prefill mixed into decode steps, which is what these runs show; the composition predicts fresh prompts)."""
    life_s = pl.col("silicon_ttft_ms") / 1e3 + (pl.col("osl") - 1) * pl.col("silicon_tpot_ms") / 1e3
    over = comp.with_columns(over=life_s < pl.col("wave_ttft_s"))
    bad = over.filter(pl.col("over"))
    by = bad.group_by("model_path", "backend", "backend_version").len().sort("len", descending=True)
    return {"rows": bad.height,
            "by_model": [f"{r['model_path']} / {r['backend']} {r['backend_version']}: {r['len']}"
                         for r in by.iter_rows(named=True)],
            "composition_without": errors(over.filter(~pl.col("over")))}


TTFT_CONCURRENCY_BINS = (8, 16, 32, 64, 128)


def ttft_ratios(comp: pl.DataFrame) -> list[dict[str, Any]]:
    """Where the composed TTFT is off: per backend, dense/MoE and concurrency bin, the median measured / composed
    TTFT of the grouped returns (engine.wave_ttft), of the stepped benchmark (engine.benchmark_ttft) and of the
    all-at-once burst, with the 10th-90th percentiles of the first two. A median far from 1 is a bias the
    composition lacks a term for; a wide spread around a median near 1 is what no scheduling term removed
    (docs/generate-accuracy.md reads this table)."""
    if comp.height == 0:
        return []
    d = comp.with_columns(
        r=pl.col("silicon_ttft_ms") / 1e3 / pl.col("grouped_ttft_s"),
        rb=pl.col("silicon_ttft_ms") / 1e3 / pl.col("burst_ttft_s"),
        rs=pl.col("silicon_ttft_ms") / 1e3 / pl.col("bench_ttft_s"),
        c_max=pl.col("batch_size").map_elements(
            lambda c: next((b for b in TTFT_CONCURRENCY_BINS if c <= b), 10**9), return_dtype=pl.Int64))
    g = d.group_by("backend", "is_moe", "c_max").agg(
        pl.len().alias("rows"), pl.col("r").median().alias("measured_over_grouped"),
        pl.col("r").quantile(0.1).alias("grouped_p10"), pl.col("r").quantile(0.9).alias("grouped_p90"),
        pl.col("rs").median().alias("measured_over_stepped"),
        pl.col("rs").quantile(0.1).alias("stepped_p10"), pl.col("rs").quantile(0.9).alias("stepped_p90"),
        pl.col("rb").median().alias("measured_over_burst"))
    out = []
    for r in g.sort("backend", "is_moe", "c_max").iter_rows(named=True):
        lo = max((b for b in TTFT_CONCURRENCY_BINS if b < r["c_max"]), default=0)
        out.append({"backend": r["backend"], "kind": "moe" if r["is_moe"] else "dense",
                    "concurrency": f"{lo + 1}-{r['c_max']}" if r["c_max"] < 10**9 else f">{lo}",
                    "rows": r["rows"], **{k: round(float(r[k]), 3) for k in (
                        "measured_over_grouped", "grouped_p10", "grouped_p90", "measured_over_stepped",
                        "stepped_p10", "stepped_p90", "measured_over_burst")}})
    return out


def silicon_markdown(res: dict[str, Any]) -> str:
    """The result of evaluate_silicon as the markdown tables docs/generate-accuracy.md quotes: errors per held-out
    group (composition, and the correction refitted without the group), pooled per split, and the layout choice."""
    def p(x: float | None) -> str:
        return "" if x is None else f"{100 * x:.1f} %"

    out = ["| held out | kind | runs | TPOT MAPE | tok/s per GPU MAPE | tok/s, corrected | TTFT MAPE | TTFT, corrected "
           "| roofline tok/s MAPE |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for sp in res["splits"]:
        for kind in ("dense", "moe"):
            c, k = sp["composition"].get(kind), sp["corrected"].get(kind)
            if c:
                out.append(f"| {sp['split']}: {sp['held_out']} | {kind} | {c['rows']:,} | {p(c['tpot_mape'])} | "
                           f"{p(c['throughput_mape'])} | {p(k['throughput_mape'])} | {p(c['ttft_mape'])} | "
                           f"{p(k['ttft_mape'])} | {p(c['roofline_throughput_mape'])} |")
    for kind in ("dense", "moe"):
        c = res["composition"].get(kind)
        if c:
            out.append(f"| **all** | {kind} | {c['rows']:,} | {p(c['tpot_mape'])} | {p(c['throughput_mape'])} | | "
                       f"{p(c['ttft_mape'])} | | {p(c['roofline_throughput_mape'])} |")
    out += ["", "| held out by | tok/s dense, corrected | tok/s MoE, corrected | TTFT dense, corrected | TTFT MoE, "
            "corrected | tok/s dense, as used | tok/s MoE, as used | TTFT dense, as used | TTFT MoE, as used |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for split in SPLITS:
        e = res[f"held_out_{split}"]["errors"]
        u = res[f"held_out_{split}"].get("as_used", {})
        d, m, ud, um = e.get("dense", {}), e.get("moe", {}), u.get("dense", {}), u.get("moe", {})
        out.append(f"| {split} | {p(d.get('throughput_mape'))} | {p(m.get('throughput_mape'))} | "
                   f"{p(d.get('ttft_mape'))} | {p(m.get('ttft_mape'))} | {p(ud.get('throughput_mape'))} | "
                   f"{p(um.get('throughput_mape'))} | {p(ud.get('ttft_mape'))} | {p(um.get('ttft_mape'))} |")
    lay = res["layout_composition"]
    out += ["", f"Layout choice in {lay['groups']} groups:", "", "| chooser | best within 5 % | mean regret |",
            "|---|---:|---:|"]
    for who, name in (("pred", "composition"), ("rule", "rule: smallest TP that fits"), ("roof", "roofline")):
        out.append(f"| {name} | {p(lay[f'{who}_within_5pct'])} | {p(lay[f'{who}_mean_regret'])} |")
    pb = res.get("prefill_bound")
    if pb and pb["rows"]:
        w = pb["composition_without"]
        out += ["", f"Runs whose measured request life is shorter than the composed prefill of their prompts alone: "
                f"{pb['rows']} ({'; '.join(pb['by_model'])}); without them, per-GPU throughput "
                f"{p(w['dense']['throughput_mape'])} dense, {p(w['moe']['throughput_mape'])} MoE (all rows: "
                f"{p(res['composition']['dense']['throughput_mape'])}, {p(res['composition']['moe']['throughput_mape'])})."]
    if res.get("ttft_ratio"):
        out += ["", "TTFT measured / composed by backend and concurrency (median, and its 10th-90th percentiles):",
                "", "| backend | kind | concurrency | runs | / grouped returns | p10-p90 | / stepped benchmark | p10-p90 "
                "| / all-at-once burst |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
        for t in res["ttft_ratio"]:
            out.append(f"| {t['backend']} | {t['kind']} | {t['concurrency']} | {t['rows']} | "
                       f"{t['measured_over_grouped']:.2f} | {t['grouped_p10']:.2f}-{t['grouped_p90']:.2f} | "
                       f"{t['measured_over_stepped']:.2f} | {t['stepped_p10']:.2f}-{t['stepped_p90']:.2f} | "
                       f"{t['measured_over_burst']:.2f} |")
    used = res["correction_used"]
    out += ["", f"Correction used: TPOT {'yes' if used['tpot'] else 'no'}, TTFT {'yes' if used['ttft'] else 'no'}."]
    return "\n".join(out) + "\n"


def _strip(x: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in x.items() if k != "cases"}


def main() -> None:  # pragma: no cover - a developer's entry point
    import sys

    r = evaluate_silicon(sys.argv[1] if len(sys.argv) > 1 else "datasets")
    print(json.dumps(r, indent=1, default=str))


if __name__ == "__main__":  # pragma: no cover
    main()
