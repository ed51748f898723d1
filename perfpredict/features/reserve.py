"""GPU memory a training plan's tensors can never use: what CUDA keeps back, the CUDA context, and NCCL's buffers.

The analytic peak (features.memory) and a measured peak (torch's max_memory_reserved or max_memory_allocated) count
only memory that passed through PyTorch's caching allocator. An out-of-memory error comes when that plus what lives
outside the allocator passes what the device has:

- What CUDA reports as total is below the catalog size (ECC, driver): features.generate.CUDA_VISIBLE_GIB, the
  figures vLLM logs (H100 80 GB: 79.19 GiB), else the catalog size x CUDA_VISIBLE_SHARE.
- The CUDA context with cuBLAS/cuDNN handles: created on the first CUDA call, outside the allocator. vLLM V0 counts
  everything outside torch on an RTX 3090 at TP 1 as 0.35 GiB (features.generate.NON_TORCH_GIB_V0, vllm#10517);
  without lazy module loading it was ~0.7 GiB (discuss.pytorch.org "What is the reason for pytorch's GPU memory
  floor", "High gpu memory overhead"). CUDA_CONTEXT_GIB takes 0.5.
- NCCL: each communicator of more than one rank allocates per channel and per peer a receive buffer per protocol,
  Simple's 4 MiB (NVIDIA/nccl src/init.cc, DEFAULT_BUFFSIZE (1 << 22), overridable with NCCL_BUFFSIZE) plus LL128's
  and LL's, with cudaMalloc, outside PyTorch's allocator. Measured on H100: vLLM 0.11 at TP 2 holds 0.54 GiB outside
  torch against 0.13 at TP 1, i.e. ~0.4 GiB for one intra-node communicator (NON_TORCH_GIB_V1), and 0.07 GiB for a
  pipeline's point-to-point links (NON_TORCH_GIB_PP_17). A plan has one communicator per parallel group of more
  than one rank (tensor, data/ZeRO shard, context, expert) and point-to-point links for pipeline stages.
- PyTorch's caching allocator rounds every block up (512 B minimum, requests over 1 MiB to 2 MiB: kMinBlockSize,
  kRoundLarge in c10/cuda/CUDACachingAllocator.cpp), packs 1-10 MiB requests into 20 MiB segments (kLargeBuffer)
  and cannot reuse split free blocks across sizes: reserved exceeds allocated by a plan-dependent share. That share
  is not a constant here: measured peaks that are max_memory_reserved (the playbook's nanotron runs) carry it, so
  it lives in the learned memory correction, the memory interval and the margin calibrated on OOM outcomes
  (models.oom), not in this fixed reserve.
- A reserved peak is not the memory a plan needs: when cudaMalloc fails the allocator first frees one cached
  unsplit block of sufficient size, then all cached unsplit blocks, and retries (c10/cuda/CUDACachingAllocator.cpp,
  the header comment and `malloc`'s release_available_cached_blocks / release_cached_blocks); only segments split by
  live blocks stay. Liger's FSDP examples (datasets/public/liger_hf_examples, padded batches of a new length every
  step) log both: reserved 1.17-1.70x allocated (11-30 GiB), up to 76.9 GiB on an 80 GiB A100, and every one ran.
  So the OOM boundary lies between the allocated peak and the reserved one: sources that log the reserved peak
  (the playbook, ms-swift) overstate the need, those that log the allocated peak (Liger) understate it, and which
  way is measured by the OOM margin (models.oom) where a cell has OOM outcomes.

A CPU host has none of this (gloo, no device context): its reserve is 0."""

from __future__ import annotations

import polars as pl

from perfpredict.features.compute import on_cpu
from perfpredict.features.generate import CUDA_VISIBLE_GIB, CUDA_VISIBLE_SHARE

c = pl.col
CUDA_CONTEXT_GIB = 0.5
NCCL_COMMUNICATOR_GIB = 0.4  # one collective communicator (H100, vLLM 0.11 TP 2 minus TP 1: 0.54 - 0.13)
NCCL_P2P_GIB = 0.07  # a pipeline rank's send/recv links (H100, vLLM 0.19 PP 2 and PP 4)


def _groups() -> pl.Expr:
    """Collective communicators a rank belongs to: one per parallel degree above 1 (ZeRO/FSDP shards over the
    data-parallel group, so they add none of their own)."""
    degrees = [c(k) for k in ("p_tp", "p_dp", "p_cp", "p_ep")]
    return sum((d.fill_null(1) > 1).cast(pl.Float64) for d in degrees)


def reserve_columns() -> list[pl.Expr]:
    """r_hidden_gib (catalog size minus what CUDA reports), r_context_gib, r_nccl_gib, r_reserve_gib (their sum) and
    r_usable_gib (what the allocator can hand out: catalog size minus the reserve), per plan row."""
    cpu = on_cpu()
    size = c("g_memory_gib").cast(pl.Float64)
    visible = c("g_name").replace_strict(CUDA_VISIBLE_GIB, default=None, return_dtype=pl.Float64)
    hidden = (size - visible.fill_null(size * CUDA_VISIBLE_SHARE)).clip(lower_bound=0.0)
    nccl = _groups() * NCCL_COMMUNICATOR_GIB + (c("p_pp").fill_null(1) > 1).cast(pl.Float64) * NCCL_P2P_GIB
    zero = pl.lit(0.0)
    return [pl.when(cpu).then(zero).otherwise(hidden).alias("r_hidden_gib"),
            pl.when(cpu).then(zero).otherwise(pl.lit(CUDA_CONTEXT_GIB)).alias("r_context_gib"),
            pl.when(cpu).then(zero).otherwise(nccl).alias("r_nccl_gib")]


def with_reserve(df: pl.DataFrame) -> pl.DataFrame:
    """df with the reserve columns (reserve_columns) and r_usable_gib."""
    out = df.with_columns(reserve_columns())
    return out.with_columns(r_reserve_gib=c("r_hidden_gib") + c("r_context_gib") + c("r_nccl_gib")).with_columns(
        r_usable_gib=c("g_memory_gib").cast(pl.Float64) - c("r_reserve_gib"))
