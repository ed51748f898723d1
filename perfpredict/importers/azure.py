"""Azure AI-benchmarking-guide published results for one 8-GPU VM each of ND A100 v4, ND H100 v5, ND H200 v5:
cuBLASLt GEMM TFLOP/s, NCCL all-reduce bus bandwidth, FlashAttention-2 / PyTorch attention TFLOP/s, HBM STREAM."""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path
from typing import Any

import polars as pl

from perfpredict.core.catalog import get_gpu
from perfpredict.importers.common import Upstream, probes_frame, run_id, write_outputs, write_source_md

MODULE = "azure"
UPSTREAM = Upstream(folder="azure_ai_benchmarking", repo="Azure/AI-benchmarking-guide",
                    commit="8fd0c6e1bd0f853ef8f0500a3640a7d80a2a92ef", date="2024-09-27", license="MIT")
SKUS = {"ND_A100_v4": "a100-sxm-80gb", "ND_H100_v5": "h100-sxm-80gb", "ND_H200_v5": "h200-sxm-141gb"}
GPUS_PER_VM = 8
# FlashAttention's benchmarks/benchmark_flash_attention.py (Dao-AILab/flash-attention), which the guide runs: model
# dim 2048, so heads = 2048 / head_dim; fp16; methods "Flash2" (flash_attn_qkvpacked_func, FlashAttention-2) and
# "Pytorch" (its attention_pytorch: baddbmm -> softmax -> einsum, the score matrix materialised: unfused "math").
# The guide's FlashAttention.py greps the block "### causal=False, headdim=128, batch_size=2, seqlen=8192 ###" (the
# H100/H200 results) or the first "batch_size=2, seqlen=8192 ###" block, which the benchmark's loop order makes
# causal=False, headdim=64 (the A100 result, stated as head dimension 64): every published row is non-causal.
ATTN_DIM = 2048
ATTN_IMPL = {"Flash Attention 2.0": "flash2", "Standard Attention(PyTorch)": "math"}
# BabelStream (the guide's HBM test) defaults: 2^25 fp64 elements per array; Copy reads one array, writes one.
STREAM_N = 2**25
STREAM_ELEM_BYTES = 8


def _system(src: Path, sku: str) -> dict[str, str]:
    """The 'System Specifications' table of ND_<sku>_results.md: GPU, CPU, CUDA, driver, NCCL, PyTorch ..."""
    path = src / f"{sku}_results.md"
    out: dict[str, str] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        m = re.match(r"\|\s*([^|]+?)\s*\|\s*([^|]+?)\s*\|\s*$", line)
        if m and not set(m.group(1)) <= set("-: "):
            out[m.group(1)] = m.group(2)
        if line.startswith("## Microbenchmarks"):
            break
    return out


def _prov(src: Path, sku: str, rel: str, benchmark: str) -> dict[str, Any]:
    sysinfo = _system(src, sku)
    fp = {"vm": sku.replace("_", " "), "gpus": GPUS_PER_VM, "nodes": 1,
          **{k.lower(): v for k, v in sysinfo.items() if k in ("GPU", "CPU", "VBIOS", "NVIDIA Driver")}}
    sw = {k.lower(): v for k, v in sysinfo.items() if k in ("CUDA", "NCCL", "PyTorch", "Ubuntu")}
    return UPSTREAM.provenance(MODULE, rel, SKUS[sku], fp, {**sw, "benchmark": benchmark})


def _rows(src: Path, name: str) -> list[tuple[int, dict[str, str]]]:
    with open(src / name, newline="", encoding="utf-8-sig") as f:
        return [(line, r) for line, r in enumerate(csv.DictReader(f), start=2)]


def import_gemm(src: Path) -> list[dict[str, Any]]:
    name = "gemm_cublaslt.csv"
    out = []
    for line, r in _rows(src, name):
        m, n, k, tflops = int(r["m"]), int(r["n"]), int(r["k"]), float(r["tflops"])
        flops = 2.0 * m * n * k
        out.append({"op": "gemm", "pass_": "fwd", "dtype": r["dtype"].lower(), "m": m, "n": n, "k": k,
                    "flops": flops, "time_s": flops / (tflops * 1e12), "outcome": "ok",
                    **_prov(src, r["sku"], name, "cuBLASLt GEMM, random init, 10000 warmups"),
                    "run_id": run_id(UPSTREAM.folder, name, line), "upstream_ref": f"{name}:{line}",
                    "sku": r["sku"], "tflops": tflops})
    return out


def _pow2(approx: int) -> int:
    return 2 ** round(math.log2(approx))


def import_allreduce(src: Path) -> list[dict[str, Any]]:
    name = "nccl_allreduce_busbw_1node.csv"
    out = []
    n = GPUS_PER_VM
    for line, r in _rows(src, name):
        size = _pow2(int(r["message_size_bytes_approx"]))
        busbw = float(r["busbw_GBps"])
        out.append({"op": "all_reduce", "pass_": "comm", "dtype": "fp32", "bytes": size, "world_size": n,
                    "ranks_per_node": n, "flops": 0.0, "time_s": size * 2 * (n - 1) / n / (busbw * 1e9),
                    "repeats": 40, "outcome": "ok",
                    **_prov(src, r["sku"], name, "nccl-tests all_reduce_perf -b 8 -e 8G -f 2 -g 8 -n 40, in-place"),
                    "run_id": run_id(UPSTREAM.folder, name, line), "upstream_ref": f"{name}:{line}",
                    "sku": r["sku"], "busbw_gbps": busbw, "size_label": r["message_size_label"]})
    return out


def import_attention(src: Path) -> list[dict[str, Any]]:
    name = "attention_tflops.csv"
    out = []
    for line, r in _rows(src, name):
        b, s, hd, tflops = int(r["batch"]), int(r["seq_len"]), int(r["head_dim"]), float(r["tflops"])
        heads = ATTN_DIM // hd
        flops = 4.0 * b * s * s * heads * hd  # non-causal forward: all of QK^T and PV
        impl = ATTN_IMPL.get(r["kernel"].strip())
        if impl is None:
            raise ValueError(f"{name}:{line}: unknown attention kernel {r['kernel']!r}; known: {sorted(ATTN_IMPL)}")
        out.append({"op": "attention", "pass_": "fwd", "dtype": "fp16", "batch": b, "heads": heads,
                    "kv_heads": heads, "seq_len": s, "head_dim": hd, "flops": flops,
                    "time_s": flops / (tflops * 1e12), "outcome": "ok", "causal": False, "attn_impl": impl,
                    **_prov(src, r["sku"], name, "flash-attention benchmarks/benchmark_flash_attention.py"),
                    "run_id": run_id(UPSTREAM.folder, name, line), "upstream_ref": f"{name}:{line}",
                    "sku": r["sku"], "tflops": tflops, "upstream_kernel": r["kernel"].strip()})
    return out


def import_stream(src: Path) -> list[dict[str, Any]]:
    name = "hbm_stream.csv"
    out = []
    for line, r in _rows(src, name):
        if r["op"].strip().lower() != "copy":
            continue
        tbps = float(r["TBps"])
        nbytes = 2 * STREAM_N * STREAM_ELEM_BYTES
        out.append({"op": "copy", "pass_": "fwd", "dtype": "fp64", "numel": STREAM_N, "bytes": nbytes,
                    "flops": 0.0, "time_s": nbytes / (tbps * 1e12), "outcome": "ok",
                    **_prov(src, r["sku"], name, "BabelStream (CUDA), default array size assumed"),
                    "run_id": run_id(UPSTREAM.folder, name, line), "upstream_ref": f"{name}:{line}",
                    "sku": r["sku"], "tb_per_s": tbps})
    return out


def import_probes(src: Path) -> pl.DataFrame:
    for hw in SKUS.values():
        get_gpu(hw)
    rows = import_gemm(src) + import_allreduce(src) + import_attention(src) + import_stream(src)
    return probes_frame(rows)


SECTION = """\
## Imported into perfpredict (perfpredict.importers.azure)

One `probes.parquet`; no `runs` (no training was published). run_id = hash of `azure_ai_benchmarking/<file>:<line>`,
`upstream_ref` names the line, `sku` the VM. Hardware: ND A100 v4 -> catalog `a100-sxm-80gb`, ND H100 v5 ->
`h100-sxm-80gb`, ND H200 v5 -> `h200-sxm-141gb`. hardware_fingerprint holds the VM, GPU, CPU, VBIOS and driver of
each ND_*_results.md system table; software holds its CUDA, NCCL, PyTorch and Ubuntu versions.

- gemm_cublaslt.csv (26): op `gemm`, pass_ `fwd`, dtype as stated (fp16 on A100, fp8 on H100/H200), m/n/k as
  published, flops = 2 m n k, time_s = flops / (TFLOP/s x 1e12); `tflops` keeps the published rate.
- nccl_allreduce_busbw_1node.csv (72): op `all_reduce`, pass_ `comm`, world_size = ranks_per_node = 8. bytes = the
  power of two nearest the approximate bytes: the guide runs `all_reduce_perf -b 8 -e 8G -f 2` (its
  Benchmarks/NVIDIA/NCCLBandwidth.py), so every size is a power of two and labels like 65K/132K/33M are rounded
  prints of 2^16/2^17/2^25. dtype fp32 (nccl-tests' default float; the script greps `float` lines), repeats 40
  (`-n 40`). time_s = bytes x 2(n-1)/n / (busbw x 1e9), the nccl-tests all-reduce bus-bandwidth relation, from the
  in-place busbw. `busbw_gbps` and `size_label` keep the published values.
- attention_tflops.csv (6): op `attention`, batch 2, seq_len 8192, head_dim as published, heads = kv_heads =
  2048 / head_dim (32 on A100, 16 on H100/H200), dtype fp16, pass_ `fwd`, `causal` false, `attn_impl` `flash2`
  (Flash Attention 2.0: flash_attn_qkvpacked_func) or `math` (Standard Attention(PyTorch): the benchmark's own
  attention_pytorch, baddbmm -> softmax -> einsum with the score matrix in memory; not torch SDPA);
  `upstream_kernel` keeps the published name. Source: FlashAttention's benchmarks/benchmark_flash_attention.py
  (Dao-AILab/flash-attention; model dim 2048, fp16), run by the guide's FlashAttention.py
  (Azure/AI-benchmarking-guide Benchmarks/FlashAttention.py and its predecessor FlashAttention.py), which greps
  `### causal=False, headdim=128, batch_size=2, seqlen=8192 ###` (H100/H200) or the first
  `batch_size=2, seqlen=8192 ###` block, which the benchmark's loop order (causal False before True, headdim 64
  before 128) makes causal=False, headdim=64 (the A100 table says head dimension 64). So every row is non-causal:
  flops = 4 x batch x seq^2 x heads x head_dim (no causal halving), time_s = flops / (TFLOP/s x 1e12).
  - Pass: the benchmark prints fwd, bwd and fwd+bwd on each method's line (each rate counted on its own FLOPs:
    bwd 2.5x, fwd+bwd 3.5x the forward) and the guide's results table shows one number without saying which.
    `fwd` is assumed, not established: the Pytorch rows sit where an unfused forward would on these memory systems
    (46 TFLOP/s A100 hd64, 145 H100 hd128, 162 H200 hd128), but the guide's later scripts (Benchmarks/NVIDIA/
    FlashAttention.py) parse and publish the `fwd + bwd` figure as "total", and FlashAttention-2's forward and
    fwd+bwd rates are within ~10% of each other at this size, so the Flash2 numbers cannot tell. If they are
    fwd+bwd rates, the rate per FLOP is still right for flash2 (within that ~10%); for math it would be 1.3-1.9x
    off (unfused backward runs at a higher rate per counted FLOP than forward in public outputs of this benchmark).
  - No public GPU source here has forward+backward attention rows: vidur's attention profiles
    (vidur/profiling/attention) are inference forward passes through sarathi's paged-KV backends under
    torch.inference_mode, and its attention.csv files are not in the snapshot; vtrain and the playbook publish no
    attention kernels.
- hbm_stream.csv: only the Copy rows (3) as op `copy`, numel 2^25, dtype fp64, bytes = 2 x 2^25 x 8 (read + write),
  time_s = bytes / (TB/s x 1e12); assumes BabelStream's default array size (the guide does not override it).
  Mul/Add/Triad/Dot are not imported (not ops we model; Copy carries the same bandwidth information).
- Provenance: source `azure_ai_benchmarking`, collected_at = upstream commit date 2024-09-27, license MIT.
"""


def run(shared_root: Path, out_root: Path) -> dict[str, int]:
    src = Path(shared_root) / UPSTREAM.folder
    out = Path(out_root) / UPSTREAM.folder
    counts = write_outputs(out, {"probes": import_probes(src)})
    write_source_md(src, out, SECTION)
    return counts
