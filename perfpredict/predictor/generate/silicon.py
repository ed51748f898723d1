"""Offline generation on GPUs with measured silicon: the time to generate a workload composed from the engine step
(models.generate.engine) over the kernels the GPU measured (models.generate.silicon).

Per replica (replicas split the prompts evenly and run side by side): R = ceil(prompts / replicas) x n requests
are queued at once (the LLM class submits them all); at most max_num_seqs run, and as many as the KV pool holds at
their mean footprint; a finished request's slot takes the next prompt in the same step (continuous batching), so
the run is the steady state of a closed loop at R offered requests. Time = the first running set's prefill (all
at once) + R x output_len decode tokens at `running` per decode step + the later prompts' chunks mixed into steps. Prompt tokens computed exclude prefix-cache hits
(features.generate.prefix_cache_hit_tokens). The 90 % interval is the composition's measured / composed TPOT spread
on the silicon runs (engine.TPOT_RATIO_INTERVAL). On a GPU the silicon set does not hold, `silicon_prediction`
returns None and the caller keeps the roofline composition with its CPU-learned correction, and says so."""

from __future__ import annotations

import math
from dataclasses import dataclass

from perfpredict.core.generate import GenScenario
from perfpredict.features.generate import (
    DEFAULT_VLLM_VERSION,
    default_max_num_batched_tokens,
    default_max_num_seqs,
    kv_cache_dtype_of,
    kv_capacity,
    prefix_cache_hit_tokens,
)
from perfpredict.models.generate.engine import (
    TPOT_RATIO_INTERVAL,
    Parallel,
    SteadyState,
    decode_breakdown,
    host_step_overhead_s,
    steady_state,
)
from perfpredict.models.generate.silicon import SiliconKernels

# The version a prediction describes when none is given, per engine. vLLM: the KV accounting's default version
# (features.generate); the kernels themselves were measured under the aiconfigurator collection's vLLM (named in
# the basis). SGLang / TensorRT-LLM: the newest versions in the silicon runs' end-to-end measurements.
DEFAULT_ENGINE_VERSION = {"vllm": DEFAULT_VLLM_VERSION, "sglang": "0.5.9", "trtllm": "1.2.0rc6"}
# Their own prefill chunk defaults on these GPUs: SGLang chunked_prefill_size 8192, TensorRT-LLM max_num_tokens 8192.
OTHER_ENGINE_BATCHED_TOKENS = 8192


@dataclass(frozen=True)
class SiliconPrediction:
    wall_s: float
    wall_lo_s: float
    wall_hi_s: float
    state: SteadyState
    engine: str
    engine_version: str
    basis: str

    def breakdown(self) -> dict[str, float]:
        return decode_breakdown(self.state)


def engine_of(sc: GenScenario) -> tuple[str, str]:
    e = sc.layout.engine
    return e, sc.layout.engine_version or DEFAULT_ENGINE_VERSION[e]


def silicon_prediction(sc: GenScenario) -> SiliconPrediction | None:
    gpu = sc.cluster.gpu
    k = None if gpu.is_cpu else SiliconKernels.for_gpu(gpu.name)
    if k is None:
        return None
    m, w, lay = sc.model, sc.workload, sc.layout
    engine, version = engine_of(sc)
    world = lay.tp * lay.pp
    cap = kv_capacity(m, gpu, tp=lay.tp, pp=lay.pp, max_model_len=sc.max_model_len, max_num_seqs=lay.max_num_seqs,
                      max_num_batched_tokens=lay.max_num_batched_tokens,
                      gpu_memory_utilization=lay.gpu_memory_utilization,
                      kv_cache_memory_bytes=lay.kv_cache_memory_bytes, dtype=w.precision,
                      kv_cache_dtype=lay.kv_cache_dtype, vllm_version=version if engine == "vllm" else None)
    if not cap.fits:
        return None
    fp8 = w.precision == "fp8"
    kv8 = kv_cache_dtype_of(w.precision, lay.kv_cache_dtype) == "fp8"
    # --enable-expert-parallel: the experts are split over the TP ranks (EP = TP inside a replica, each expert
    # whole on one rank) instead of every expert's matrices over all of them.
    ep = lay.tp if lay.expert_parallel and m.is_moe else 1
    par = Parallel(tp=lay.tp, pp=lay.pp, moe_tp=1 if ep > 1 else 0, moe_ep=ep, gemm_dtype="fp8" if fp8 else "bfloat16",
                   moe_dtype="fp8" if fp8 else "bfloat16", kv_dtype="fp8" if kv8 else "bfloat16")
    prompts = math.ceil(w.prompts / lay.replicas)
    R = prompts * w.samples_per_prompt
    hits = 0
    if lay.prefix_caching:
        hits = prefix_cache_hit_tokens(prompts=prompts, samples_per_prompt=w.samples_per_prompt,
                                       input_len=w.input_len, shared_prefix_len=w.shared_prefix_len,
                                       block_size=cap.block_size)
    computed = max(R * w.input_len - hits, R) / R
    if engine == "vllm":
        mbt = lay.max_num_batched_tokens or default_max_num_batched_tokens(gpu, world, vllm_version=version)
    else:
        mbt = lay.max_num_batched_tokens or OTHER_ENGINE_BATCHED_TOKENS
    mns = lay.max_num_seqs or default_max_num_seqs(gpu, world)
    s = steady_state(k, m, gpu, par, concurrency=R, input_len=w.input_len, output_len=w.output_len,
                     max_num_batched_tokens=mbt, engine=engine, max_num_seqs=mns, kv_pool_tokens=cap.pool_tokens,
                     computed_prompt=computed, overhead_s=host_step_overhead_s(engine, version))
    # The first running set prefills at once; every later prompt's chunks ride in decode steps.
    decode = R * w.output_len * s.decode_tpot_s / s.concurrency
    wall = s.first_wave_s + decode + max(R - s.concurrency, 0.0) * s.prefill_per_prompt_s
    lo, hi = TPOT_RATIO_INTERVAL[m.is_moe]
    basis = (f"composed from kernels measured on {gpu.name} (aiconfigurator, vLLM {k.version or '?'} kernels)"
             + ("" if engine == "vllm" else f"; {engine} modelled with vLLM's kernels and scheduling"))
    return SiliconPrediction(wall_s=wall, wall_lo_s=wall * lo, wall_hi_s=wall * hi, state=s, engine=engine,
                             engine_version=version, basis=basis)
