"""The engine step composed from measured silicon (models.generate.silicon), and the steady state of continuous
batching as vLLM V1 schedules it.

One forward of a scheduled batch (one pipeline stage's layers, or all of them): per layer the QKV, output, and MLP
GEMMs at m = the batch's tokens (decode tokens + prefill chunk tokens: vLLM V1 runs them as one flattened batch),
decode attention over each running request's KV length, prefill attention over the chunk, the fused MoE layer by
tokens / experts / TP / EP for MoE layers, two tensor-parallel all-reduces per layer (after attention and after the
MLP: RowParallelLinear reduces its output, vllm/model_executor/layers/linear.py) with vLLM's custom all-reduce up
to its buffer size and NCCL above, norms/rotary/activation/residual as HBM traffic, and the LM head over the rows
that sample.

Scheduling (vllm/v1/core/sched/scheduler.py, Scheduler.schedule, read at vllm-project/vllm 00024d3): each step
first gives every RUNNING request its next tokens (one for a decode, the rest of its prompt for a prefill, capped
by the remaining token budget = max_num_batched_tokens: chunked prefill), then admits WAITING requests while the
budget lasts and fewer than max_num_seqs run; a request whose next block cannot be allocated preempts the newest
running one (recompute: its prompt and output are prefilled again). Requests in equal-length generation reach a
steady state: a decode share d and a prefill share p of every step.

Pipeline parallelism (vllm/config/vllm.py max_concurrent_batches: "PP requires PP-size concurrent batches to fill
the pipeline"; vllm/v1/engine/core.py EngineCore.step_with_batch_queue): the engine keeps pp batches in flight;
a request in a batch that has not come back gets no new tokens (Scheduler.schedule, "PP>1 and we have already
scheduled all prompt tokens but they are not finished yet"), so the running requests split into pp disjoint
micro-batches of c/pp. A request's next token needs its micro-batch to pass every stage: TPOT = pp x (one stage's
layers at batch c/pp + the activation send to the next stage). In decode, where a step reads every weight once
whatever the batch, that is ~pp times the TP step at the same concurrency: PP is not free."""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from perfpredict.core.errors import PerfPredictError, require
from perfpredict.core.hardware import GPUSpec
from perfpredict.core.model import ModelSpec
from perfpredict.features.generate import kv_heads_per_rank, parse_vllm_version
from perfpredict.features.generate import stage_layers as stage_layer_counts
from perfpredict.models.generate.compose import GPU_STEP_OVERHEAD_S
from perfpredict.models.generate.silicon import SiliconKernels

# Host work per engine step not seen in kernel times (scheduler, input preparation, sampling). vLLM V1 overlaps it
# with the GPU (async scheduling, CUDA graphs); on the silicon runs a fitted per-step overhead traded against the
# kernel scale and lost on every held-out split (train.generate_silicon), so the composition carries none.
STEP_OVERHEAD_S = {"vllm": 0.0, "sglang": 0.0, "trtllm": 0.0}
# ...except where the engine, at its version's defaults, does not overlap it. vLLM turned async scheduling on by
# default in 0.14.0 (vllm#27614; vllm/config/vllm.py, VllmConfig: "elif self.scheduler_config.async_scheduling is
# None: # Enable async scheduling unless there is an incompatible option"); before it the default Scheduler and
# one batch in flight (executor max_concurrent_batches = 2 only with async_scheduling) run schedule -> execute ->
# update_from_output one after the other, so the host's work per step sits between GPU steps. SGLang's overlap
# scheduler (server_args.py disable_overlap_schedule = False) and TensorRT-LLM's (llm_args.py
# disable_overlap_scheduler = False) are on by default in every version the silicon runs name. An unknown version
# is taken as overlapped (the composition's default).
VLLM_ASYNC_SCHEDULING_DEFAULT = (0, 14, 0)


def host_step_overhead_s(engine: str, version: str | None) -> float:
    """Host time per engine step left between GPU steps at the engine's defaults: the project's stated per-step
    estimate (models.generate.compose.GPU_STEP_OVERHEAD_S, not fitted to any run) for vLLM before 0.14, else
    STEP_OVERHEAD_S."""
    if engine == "vllm" and version:
        try:
            if parse_vllm_version(version) < VLLM_ASYNC_SCHEDULING_DEFAULT:
                return GPU_STEP_OVERHEAD_S
        except PerfPredictError:  # nightly builds and other non-release tags: the default
            pass
    return STEP_OVERHEAD_S.get(engine, 0.0)
# The host's round trip per scheduled batch (update_from_output, schedule, broadcast to the workers): the stated
# estimate the roofline composition uses (models.generate.compose.GPU_STEP_OVERHEAD_S). With pipeline parallelism
# vLLM keeps exactly pp batches in flight (vllm/config/vllm.py max_concurrent_batches: "PP requires PP-size
# concurrent batches to fill the pipeline"; pp + 1 only with the V2 model runner), so a micro-batch leaving the
# last stage waits for it before re-entering the first, and the first stage idles that long once per cycle; at
# pp = 1 async scheduling keeps a second batch in flight and hides it.
PP_HOST_ROUNDTRIP_S = 1.5e-3
# Measured / composed TPOT on the silicon runs (docs/generate-accuracy.md), 5th and 95th percentiles: the 90 %
# interval of a composed time, dense and MoE.
TPOT_RATIO_INTERVAL = {False: (0.73, 1.35), True: (0.57, 1.54)}
ELEMENTWISE_PASSES = 10  # hidden-sized reads+writes per layer outside GEMMs: 2 norms, rotary, act, 2 residuals


@dataclass(frozen=True)
class Parallel:
    """One replica's layout and formats."""

    tp: int = 1
    pp: int = 1
    moe_tp: int = 0       # 0 = tp (vLLM shards experts by TP unless expert parallelism is on)
    moe_ep: int = 1
    gemm_dtype: str = "bfloat16"   # bfloat16 | fp8 | fp8_block (the silicon GEMM formats)
    moe_dtype: str = "bfloat16"
    kv_dtype: str = "bfloat16"
    act_bytes: int = 2

    def __post_init__(self) -> None:
        for f in ("tp", "pp", "moe_ep"):
            require(getattr(self, f) >= 1, f"{f} must be >= 1, got {getattr(self, f)}")

    @property
    def expert_tp(self) -> int:
        return self.moe_tp or max(1, self.tp // self.moe_ep)


@dataclass(frozen=True)
class StepParts:
    """Seconds of one forward, by part."""

    gemm_s: float
    attention_s: float
    moe_s: float
    all_reduce_s: float
    elementwise_s: float
    head_s: float
    send_s: float = 0.0

    @property
    def total_s(self) -> float:
        return (self.gemm_s + self.attention_s + self.moe_s + self.all_reduce_s + self.elementwise_s + self.head_s
                + self.send_s)

    def scaled(self, f: float) -> StepParts:
        return StepParts(*(getattr(self, k) * f for k in ("gemm_s", "attention_s", "moe_s", "all_reduce_s",
                                                           "elementwise_s", "head_s", "send_s")))

    def plus(self, o: StepParts) -> StepParts:
        return StepParts(*(getattr(self, k) + getattr(o, k) for k in ("gemm_s", "attention_s", "moe_s",
                                                                        "all_reduce_s", "elementwise_s", "head_s",
                                                                        "send_s")))


def forward(k: SiliconKernels, m: ModelSpec, gpu: GPUSpec, par: Parallel, *, decode: float, ctx: float,
            prefill_tokens: float = 0.0, prefill_len: float = 1.0, layers: float | None = None,
            sample_rows: float | None = None) -> StepParts:
    """One forward of a batch of `decode` decode requests (mean KV length ctx) and `prefill_tokens` prompt tokens
    (in pieces of prefill_len), through `layers` layers (default all) with the LM head when sample_rows > 0."""
    L = m.layers if layers is None else layers
    T = max(decode + prefill_tokens, 1.0)
    d = m.head_dim
    gd = par.gemm_dtype

    def shard(tp: int) -> tuple[float, float, float]:
        """GEMM, MoE and attention seconds per layer with the layer split over tp ranks."""
        hq = max(1, m.heads // tp)
        kvh = kv_heads_per_rank(m, tp)
        g = float(k.gemm(T, (hq + 2 * kvh) * d, m.hidden, gd)[0] + k.gemm(T, m.hidden, hq * d, gd)[0])
        moe = 0.0
        if m.is_moe:
            g += float(k.gemm(T, m.experts, m.hidden, "bfloat16")[0])  # router
            moe = float(k.moe(T, hidden=m.hidden, inter=m.expert_ffn, topk=m.experts_per_token,
                              experts=m.experts, tp=par.expert_tp if tp == par.tp else 1,
                              ep=par.moe_ep if tp == par.tp else 1, dtype=par.moe_dtype)[0])
        else:
            f = max(1, m.ffn // tp)
            g += float(k.gemm(T, (2 if m.gated_mlp else 1) * f, m.hidden, gd)[0] + k.gemm(T, m.hidden, f, gd)[0])
        att = 0.0
        if decode >= 0.5:
            att += float(k.decode_attention(decode, ctx, heads=hq, kv_heads=kvh, head_dim=d,
                                            kv_dtype=par.kv_dtype)[0])
        if prefill_tokens >= 1:
            seqs = max(prefill_tokens / max(prefill_len, 1.0), 1.0)
            att += float(k.prefill_attention(seqs, prefill_len, heads=hq, kv_heads=kvh, head_dim=d)[0])
        return g, moe, att

    tp = par.tp
    g, moe, att = shard(tp)
    if tp > 1:
        # A layer split over tp ranks is never more than tp times faster per rank than the whole layer on one:
        # where the measured grid says so (tile and wave quantisation between neighbouring shapes, interpolation),
        # the whole layer / tp bounds it, so TP never buys a superlinear speed-up.
        g1, moe1, att1 = shard(1)
        g, moe, att = max(g, g1 / tp), max(moe, moe1 / tp), max(att, att1 / tp)
    ar = 2 * float(k.all_reduce(T * m.hidden * par.act_bytes, tp)[0]) if tp > 1 else 0.0
    ew = ELEMENTWISE_PASSES * T * m.hidden * par.act_bytes / (gpu.hbm_tb_per_s * 1e12)
    rows = decode + prefill_tokens / max(prefill_len, 1.0) if sample_rows is None else sample_rows
    head = float(k.gemm(max(rows, 1.0), max(1, m.vocab // tp), m.hidden, "bfloat16")[0]) if rows > 0 else 0.0
    return StepParts(gemm_s=g * L, attention_s=att * L, moe_s=moe * L, all_reduce_s=ar * L, elementwise_s=ew * L,
                     head_s=head)


@dataclass(frozen=True)
class SteadyState:
    """Continuous batching at a steady concurrency, per replica."""

    concurrency: float          # running requests (KV- and max_num_seqs-limited)
    offered: float              # requests kept in the system (running + waiting)
    queue_s: float              # mean wait in the queue for a running slot (closed loop)
    limited_by: str             # what caps the running requests: "offered", "max_num_seqs" or "KV cache"
    tpot_s: float               # mean time between a request's output tokens
    ttft_s: float               # mean time from arrival (slot free) to the first token, in steady state
    burst_ttft_s: float         # mean time to first token when all `concurrency` prompts arrive at once
    first_wave_s: float         # prefill of the first running set when all arrive at once (an offline run's start)
    wave_ttft_s: float          # mean TTFT after the opening burst when every request has the same lengths
    decode_tpot_s: float        # TPOT without the prefill chunks mixed in
    prefill_per_prompt_s: float  # what one prompt's chunks add to the run when mixed into decode steps
    decode_step: StepParts      # one decode-only cycle (all pp micro-batches), for --explain
    prefill_share: float        # of a cycle's time, the prefill chunks mixed in
    prefill_steps: int          # steps a prompt's prefill spans
    overhead_s: float
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def output_tokens_per_s(self) -> float:
        return self.concurrency / self.tpot_s


def steady_state(k: SiliconKernels, m: ModelSpec, gpu: GPUSpec, par: Parallel, *, concurrency: float,
                 input_len: int, output_len: int, max_num_batched_tokens: int, engine: str = "vllm",
                 overhead_s: float | None = None, max_num_seqs: int | None = None,
                 kv_pool_tokens: float | None = None, computed_prompt: float | None = None) -> SteadyState:
    """TPOT and TTFT of `concurrency` requests of input_len -> output_len kept in the system (a closed loop: a
    finished request's slot takes the next prompt at once, as a benchmark at fixed concurrency or an offline run
    with more prompts than fit do). At most max_num_seqs run, and as many as the KV pool holds at their mean
    footprint (prompt + half the output: blocks are taken as tokens are generated, and vLLM preempts the newest
    when the next block is not there, so the pool is what caps the running set); the rest wait, and by Little's law
    wait (offered - running) / running lifetimes of a request. computed_prompt: prompt tokens a request computes
    (less when the prefix cache serves some; default input_len), the KV length stays input_len."""
    offered = max(float(concurrency), 1.0)
    c, limited = offered, "offered"
    if max_num_seqs is not None and max_num_seqs < c:
        c, limited = float(max_num_seqs), "max_num_seqs"
    if kv_pool_tokens is not None:
        fit = max(kv_pool_tokens / (input_len + output_len / 2), 1.0)
        if fit < c:
            c, limited = fit, "KV cache"
    pp = par.pp
    ovh = STEP_OVERHEAD_S.get(engine, 0.0) if overhead_s is None else overhead_s
    stage_layers = stage_layer_counts(m.layers, pp)
    send_bytes = par.act_bytes * m.hidden
    mb = c / pp  # requests per micro-batch
    ctx = input_len + output_len / 2
    # Prefill mixes into steps: a prompt takes the budget left after the running decodes (chunked prefill).
    prompt = float(input_len if computed_prompt is None else max(computed_prompt, 1.0))
    budget = max(max_num_batched_tokens - mb, 1.0)
    chunk = float(min(prompt, budget))
    n_pre = max(1, math.ceil(prompt / budget))
    life = output_len - 1 + n_pre  # steps of a request's life (per micro-batch)
    dec = mb * (output_len - 1) / life
    pre_per_step = mb * prompt / life  # prompt tokens per micro-batch step, on average

    def cycle(decode: float, ptoks: float, plen: float) -> StepParts:
        # One micro-batch through every stage. With pp micro-batches in flight each advances one stage per tick
        # and the tick is the slowest stage's time: the last, which also runs the LM head, and sends its
        # activations on (the pipeline's bubble when stages are unequal). TPOT = pp ticks.
        one = forward(k, m, gpu, par, decode=decode, ctx=ctx, prefill_tokens=ptoks, prefill_len=plen,
                      layers=max(stage_layers), sample_rows=decode + (ptoks / max(plen, 1.0)))
        send = float(k.send((decode + ptoks) * send_bytes)[0]) if pp > 1 else 0.0
        return one.scaled(pp).plus(StepParts(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, send * pp)) if pp > 1 else one

    dstep = cycle(dec, 0.0, 1.0)
    if pp > 1:
        dstep = dstep.plus(StepParts(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, PP_HOST_ROUNDTRIP_S))
    mixed = cycle(dec, chunk, chunk)
    # Steps carrying a chunk are slower by (mixed - dstep); a share pre_per_step / chunk of steps carries one. The
    # cost per prompt token is read over at least 1,024 tokens: a difference of two nearby points of the measured
    # grid (a 64-token prompt beside a 256-request decode) is noise, and could make TP look superlinear.
    probe = float(min(budget, max(chunk, 1024.0)))
    rate = (cycle(dec, probe, chunk).total_s - dstep.total_s) / probe if probe > chunk else \
        (mixed.total_s - dstep.total_s) / chunk
    extra = max(rate, 0.0) * pre_per_step
    per_prompt = max(rate, 0.0) * prompt / pp  # a cycle carries pp micro-batches' chunks
    tpot = dstep.total_s + extra + ovh
    # TTFT: the prompt's chunks (each a mixed step) and, on arrival, on average half a step before it is scheduled;
    # plus the queue when more requests are offered than run.
    queue = (offered - c) / c * life * tpot
    ttft = queue + n_pre * (mixed.total_s + ovh) + 0.5 * tpot
    # All prompts at once (a benchmark's or an offline run's start): full-budget prefill steps, one after another;
    # the mean request waits for half of them.
    full = cycle(0.0, float(min(max_num_batched_tokens, c * prompt)), prompt)
    steps = math.ceil(c * prompt / max_num_batched_tokens)
    burst = queue + (steps + 1) / 2 * (full.total_s + ovh)
    first_wave = steps * (full.total_s + ovh)
    wave = wave_ttft(cycle, c=c, mb=mb, prompt=prompt, dec=dec, budget_tokens=max_num_batched_tokens,
                     decode_cycle_s=dstep.total_s, overhead_s=ovh)
    notes = []
    if pp > 1:
        notes.append(f"PP{pp}: {pp} micro-batches of {mb:.0f} requests; each token crosses {pp} stages")
    return SteadyState(concurrency=c, offered=offered, queue_s=queue, limited_by=limited, tpot_s=tpot, ttft_s=ttft,
                       burst_ttft_s=burst, first_wave_s=first_wave, wave_ttft_s=queue + wave,
                       decode_tpot_s=dstep.total_s + ovh,
                       prefill_per_prompt_s=per_prompt, decode_step=dstep,
                       prefill_share=extra / tpot, prefill_steps=n_pre, overhead_s=ovh, notes=tuple(notes))


def wave_ttft(cycle, *, c: float, mb: float, prompt: float, dec: float, budget_tokens: int, decode_cycle_s: float,
              overhead_s: float) -> float:
    """Mean TTFT in a closed loop whose requests all have the same prompt and output lengths (a benchmark at fixed
    concurrency with fixed isl / osl and ignore_eos, or an offline run of equal requests).

    The opening burst is prefilled in budget-sized steps, max_num_batched_tokens less the running decodes
    (vllm/v1/core/sched/scheduler.py, Scheduler.schedule: RUNNING requests first, then WAITING ones FCFS while
    token_budget lasts), so the requests whose prefill ends in the same step form a group of g = c / k (k = the
    steps the burst takes). Every member of a group then emits one token per step and finishes in the same step,
    its client sends the next prompt at once, and the group comes back together: the grouping persists. A member
    of a returning group waits for the step in flight (the engine has scheduled the next step before the new
    request reaches it; none when the whole running set returns at once) and then for its group's prefill, which
    takes the budget left beside the other groups' decodes, in FCFS order (member j is done after
    ceil(j x prompt / budget) steps)."""
    k = max(1, math.ceil(c * prompt / max(budget_tokens - mb, 1.0)))
    g = max(1.0, c / k)
    others = max(dec * (1.0 - g / max(c, 1.0)), 0.0)  # decodes beside a returning group, per micro-batch
    budget = max(budget_tokens - others, 1.0)
    n = max(1, round(g))
    ends = [math.ceil(j * prompt / budget) for j in range(1, n + 1)]
    steps_mean = sum(ends) / n
    chunk = min(n * prompt, budget)
    step = cycle(others, chunk, min(prompt, chunk)).total_s + overhead_s
    wait = 0.0 if k == 1 else decode_cycle_s + overhead_s
    return wait + steps_mean * step


def prefill_first_waves(s: SteadyState, output_len: int) -> tuple[float, float]:
    """(TTFT, TPOT) in seconds of a closed loop of equal requests on an engine that runs any waiting prefill before
    a decode step: SGLang at its defaults (python/sglang/srt/managers/scheduler.py, Scheduler.get_next_batch_to_run:
    `if new_batch is not None: # Run prefill first if possible`; prefill chunks join the decodes only with
    `enable_mixed_chunk`, default False in server_args.py, get_new_batch_prefill "Mixed-style chunked prefill").

    The opening burst is prefilled in full-budget batches while nothing decodes, so every request of it starts
    decoding in the same step, finishes in the same step, and its client's next prompts arrive together: each round
    is the burst again. TTFT = the burst's mean wait (s.burst_ttft_s). A request's tokens after the first come once
    the whole burst is prefilled, so its client-side TPOT, (end-to-end - TTFT) / (osl - 1), carries the rest of the
    burst after its own first token: TPOT = decode step + (whole burst - mean first token) / (osl - 1)."""
    burst_s = s.burst_ttft_s - s.queue_s
    tpot = s.decode_tpot_s + max(s.first_wave_s - burst_s, 0.0) / max(output_len - 1, 1)
    return s.burst_ttft_s, tpot


@dataclass(frozen=True)
class BatchWait:
    """TensorRT-LLM's batch waiting (LLM API options batch_wait_timeout_iters, batch_wait_max_tokens_ratio; both 0,
    i.e. off, by default). NVIDIA/TensorRT-LLM tensorrt_llm/_torch/pyexecutor/py_executor.py: PyExecutor._schedule
    calls _waiting_requests when context and generation requests are both scheduled ("if no generation requests, no
    need to wait"); it holds every scheduled context request back, one iteration at a time, until
    batch_wait_iters_count >= batch_wait_timeout_iters or the scheduled tokens (prompt tokens + one per decode) reach
    batch_wait_max_tokens_ratio x max_num_tokens, then releases them all and resets the count."""

    timeout_iters: int
    max_tokens_ratio: float

    def __post_init__(self) -> None:
        require(self.timeout_iters >= 0, f"timeout_iters must be >= 0, got {self.timeout_iters}")
        require(0.0 <= self.max_tokens_ratio <= 1.0,
                f"max_tokens_ratio must be in [0, 1], got {self.max_tokens_ratio}")


def batch_wait_ttft_s(s: SteadyState, wait: BatchWait, *, prompt: float, output_len: int,
                      max_num_tokens: int) -> float:
    """Random-arrival TTFT (s.ttft_s) with TensorRT-LLM's batch waiting on. A closed loop of s.concurrency requests
    sends a new prompt per completion: lam = c / (iterations of a request's life) per iteration. The first prompt to
    arrive opens a window of W iterations (the timeout, or sooner once enough prompts arrived to reach the token
    threshold beside the c decodes); the prompts arriving inside it wait the rest of it, W / 2 on average. Mean wait
    in iterations: W (1 + lam W / 2) / (1 + lam W), each a decode step (the held prompts do not run), and the
    released group's 1 + lam W prompts prefill in one step, so a prompt's first token also waits for the others'."""
    c = max(s.concurrency, 1.0)
    threshold = wait.max_tokens_ratio * max_num_tokens
    arrivals_needed = math.ceil(max(threshold - c, 0.0) / max(prompt, 1.0))
    if wait.timeout_iters <= 0 or arrivals_needed <= 1:
        return s.ttft_s  # the first prompt beside the decodes meets the threshold (ratio 0 included): no wait
    lam = c / max(output_len - 1 + s.prefill_steps, 1)
    window = min(float(wait.timeout_iters), (arrivals_needed - 1) / lam)
    group = 1.0 + lam * window
    iters = window * (1.0 + lam * window / 2.0) / group
    return s.ttft_s + iters * s.decode_tpot_s + (group - 1.0) * s.prefill_per_prompt_s


def decode_breakdown(s: SteadyState) -> dict[str, float]:
    p = s.decode_step
    return {"gemm": p.gemm_s, "attention": p.attention_s, "moe": p.moe_s, "all_reduce": p.all_reduce_s,
            "elementwise": p.elementwise_s, "lm_head": p.head_s, "pp_send": p.send_s,
            "prefill_mixed_in": s.prefill_share * s.tpot_s, "overhead": s.overhead_s}


def roofline_tpot(m: ModelSpec, gpu: GPUSpec, par: Parallel, *, concurrency: float, input_len: int,
                  output_len: int) -> float:
    """The baseline the issue asks beside the composition: a decode step as max(weights + KV read at HBM
    bandwidth, FLOPs at peak), per replica of tp x pp GPUs, no overheads."""
    c = max(concurrency, 1.0)
    wbytes = 1.0 if par.gemm_dtype.startswith("fp8") else 2.0
    active = m.active_param_count if m.is_moe else m.param_count
    weights = (m.param_count if m.is_moe else active) * wbytes / (par.tp * par.pp)
    if m.is_moe:  # experts touched at batch c: all of them once c x topk exceeds their number
        touched = min(1.0, c * m.experts_per_token / m.experts)
        weights = (active + (m.param_count - active) * touched) * wbytes / (par.tp * par.pp)
    kv = c * (input_len + output_len / 2) * 2 * m.kv_heads * m.head_dim * 2 * m.layers / (par.tp * par.pp)
    mem = (weights + kv) / (gpu.hbm_tb_per_s * 1e12)
    flops = 2 * active * c / (par.tp * par.pp)
    peak = (gpu.fp8_tflops if wbytes == 1 else gpu.bf16_tflops) * 1e12
    return max(mem, flops / peak) * par.pp


def as_array(x) -> np.ndarray:
    return np.atleast_1d(np.asarray(x, dtype=float))




def benchmark_ttft(*, concurrency: float, prompt: int, output_len: int, budget_tokens: int, decode_step_s: float,
                   prefill_token_s: float, rounds: int = 20, prefill_first: bool = False) -> float:
    """Mean TTFT of a fixed-concurrency benchmark of equal requests, stepped as the engine schedules them.

    The client (AIPerf as AIConfigurator runs it: `--concurrency c --num-requests 20c --warmup-request-count 2c`,
    ai-dynamo/aiconfigurator tests/baseline/*/bench_run.sh; AIPerf waits for every warmup response before the
    profiling phase starts, its docs "Warmup Phase Configuration", Grace Period) sends c prompts at once, then a
    new one as each finishes, until rounds x c have been sent. Each step the engine gives every decoding request one token
    and prefills waiting prompts FCFS in what is left of max_num_batched_tokens, a prompt taking min(its remaining
    tokens, the budget left) (vLLM V1: vllm/v1/core/sched/scheduler.py, Scheduler.schedule, RUNNING before
    WAITING, `num_new_tokens = min(num_new_tokens, token_budget)`). With prefill_first (SGLang:
    python/sglang/srt/managers/scheduler.py, Scheduler.get_next_batch_to_run, "Run prefill first if possible")
    a step with a prompt waiting is a prefill batch alone and the decodes wait for it. A prompt's first token
    comes at the end of the step that computes its last chunk; a prompt that reaches the engine during a step is
    first scheduled in the step after the next (the next is already scheduled: async scheduling). Step time:
    decode_step_s when the step runs anything (the weights are read whatever the batch) plus prefill_token_s per
    prompt token in it. Stretches of decode-only steps are jumped over."""
    c = max(1, int(round(concurrency)))
    total = max(rounds, 1) * c
    incoming: deque[tuple[int, float]] = deque([(0, 0.0)] * c)  # (first step it can join, time the client sent it)
    waiting: deque[list[float]] = deque()
    sent, n_dec, dsteps, step, t = c, 0, 0, 0, 0.0
    fin: list[tuple[int, int]] = []   # (decode steps run when the group emits its last token, requests)
    sum_ttft, n_ttft = 0.0, 0
    while waiting or n_dec or incoming:
        while incoming and incoming[0][0] <= step:
            waiting.append([float(prompt), incoming.popleft()[1]])
        if not waiting:
            if not n_dec:  # idle engine: the next prompt is scheduled as it arrives
                step = incoming[0][0]
                continue
            skip = fin[0][0] - dsteps - 1
            if incoming:
                skip = min(skip, incoming[0][0] - step)
            if skip > 0:
                t += skip * decode_step_s
                dsteps += skip
                step += skip
                continue
        run_dec = n_dec > 0 and not (prefill_first and waiting)
        left = budget_tokens - (n_dec if run_dec else 0)
        p_tok = 0.0
        firsts = []
        while waiting and left > 0:
            q = waiting[0]
            take = min(q[0], left)
            q[0] -= take
            left -= take
            p_tok += take
            if q[0] > 0:
                break
            firsts.append(waiting.popleft())
        dt = (decode_step_s if (run_dec or p_tok) else 0.0) + prefill_token_s * p_tok
        t += dt
        done = 0
        if run_dec:
            dsteps += 1
            while fin and fin[0][0] <= dsteps:
                done += heapq.heappop(fin)[1]
            n_dec -= done
        for q in firsts:
            sum_ttft += t - q[1]
            n_ttft += 1
        if firsts:
            if output_len > 1:
                heapq.heappush(fin, (dsteps + output_len - 1, len(firsts)))
                n_dec += len(firsts)
            else:
                done += len(firsts)
        new = min(done, total - sent)
        if new > 0:
            sent += new
            # sent now, it reaches the engine while the next step (already scheduled) runs: it joins the one after
            incoming.extend([(step + 2, t)] * new)
        step += 1
    return sum_ttft / max(n_ttft, 1)
