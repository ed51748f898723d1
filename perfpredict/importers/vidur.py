"""microsoft/vidur profiling data: forward per-op times of one tensor-parallel shard of a transformer layer (A100,
H100, A40; 8 models) and all-reduce / send-recv times vs message size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from perfpredict.core.catalog import get_gpu
from perfpredict.importers.common import (
    Upstream,
    log_spaced,
    probes_frame,
    run_id,
    write_outputs,
    write_source_md,
)

MODULE = "vidur"
UPSTREAM = Upstream(folder="vidur", repo="microsoft/vidur", commit="7d47513363ec447a741ac5e47241580b47724fbf",
                    date="2024-11-19", license="MIT",
                    software={"framework": "vidur profiling (sarathi-serve model code)", "timer": "torch kineto"})
COMPUTE_GPUS = {"a100": "a100-sxm-80gb", "h100": "h100-sxm-80gb", "a40": "a40"}
# network node types: DGX boxes are SXM parts; the *_pairwise_nvlink types are Azure NC-series VMs with PCIe cards
# bridged in NVLink pairs (NC A100 v4: A100 PCIe 80GB; NC H100 v5: H100 NVL 94GB, closest catalog entry h100-pcie-80gb).
NETWORK_GPUS = {"a100_dgx": "a100-sxm-80gb", "h100_dgx": "h100-sxm-80gb", "a100_pairwise_nvlink": "a100-pcie-80gb",
                "h100_pairwise_nvlink": "h100-pcie-80gb", "a40_pairwise_nvlink": "a40"}
TOKENS_PER_FILE = 40
DTYPE = "fp16"
BYTES = 2

GEMMS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")


def _gemm_shape(op: str, r: dict[str, Any]) -> tuple[int, int]:
    """(k, n) of one forward GEMM of a tp shard; m is num_tokens."""
    tp, h, heads, kv = r["num_tensor_parallel_workers"], r["n_embd"], r["n_head"], r["n_kv_head"]
    hd, ffn = h // heads, r["n_expanded_embd"]
    if op == "attn_pre_proj":
        return h, (heads + 2 * kv) * hd // tp
    if op == "attn_post_proj":
        return heads * hd // tp, h
    if op == "mlp_up_proj":
        return h, (2 if r["use_gated_mlp"] else 1) * ffn // tp
    if op == "mlp_down_proj":
        return ffn // tp, h
    raise KeyError(op)


def _memory_ops(r: dict[str, Any], model: str) -> list[tuple[str, str, int, int]]:
    """(upstream op, our op, numel, bytes moved) of the memory-bound ops: norm, activation, residual add."""
    t, h, tp, ffn = r["num_tokens"], r["n_embd"], r["num_tensor_parallel_workers"], r["n_expanded_embd"]
    norm = "layernorm" if "phi-2" in model else "rmsnorm"
    act_numel = t * ffn // tp
    if r["use_gated_mlp"]:
        act = ("swiglu", act_numel, 3 * act_numel * BYTES)  # reads gate and up, writes one
    else:
        act = ("gelu", act_numel, 2 * act_numel * BYTES)
    return [("input_layernorm", norm, t * h, 2 * t * h * BYTES),
            ("mlp_act", act[0], act[1], act[2]),
            ("add", "add", t * h, 3 * t * h * BYTES)]


def _stats(r: dict[str, Any], op: str) -> tuple[float, float | None]:
    median, mean, std = (r[f"time_stats.{op}.{s}"] for s in ("median", "mean", "std"))
    return median / 1000.0, (std / mean if mean else None)


def import_compute(src: Path, tokens_per_file: int = TOKENS_PER_FILE) -> pl.DataFrame:
    base = src / "data" / "profiling" / "compute"
    rows: list[dict[str, Any]] = []
    for path in sorted(base.glob("*/*/*/mlp.csv")):
        gpu_key = path.relative_to(base).parts[0]
        hw = COMPUTE_GPUS[gpu_key]
        get_gpu(hw)
        model = "/".join(path.relative_to(base).parts[1:3])
        rel = str(path.relative_to(src))
        df = pl.read_csv(path).with_row_index("line", offset=2)
        # A few (num_tokens, tp) pairs were profiled twice; the first measurement is kept.
        df = df.unique(subset=["num_tokens", "num_tensor_parallel_workers"], keep="first", maintain_order=True)
        keep = log_spaced(df["num_tokens"].to_list(), tokens_per_file)
        df = df.filter(pl.col("num_tokens").is_in(keep)).sort("num_tensor_parallel_workers", "num_tokens")
        fp = {"gpu": gpu_key.upper(), "gpus": 1, "catalog_assumed": hw}
        prov = UPSTREAM.provenance(MODULE, rel, hw, fp)
        for r in df.iter_rows(named=True):
            common = {"pass_": "fwd", "dtype": DTYPE, "outcome": "ok", **prov, "upstream_ref": f"{rel}:{r['line']}",
                      "model": model, "tp": r["num_tensor_parallel_workers"]}
            for op in GEMMS:
                k, n = _gemm_shape(op, r)
                m = r["num_tokens"]
                t, spread = _stats(r, op)
                rows.append({"op": "gemm", "m": m, "n": n, "k": k, "flops": 2.0 * m * n * k, "time_s": t,
                             "time_spread": spread, "run_id": run_id(UPSTREAM.folder, rel, r["line"], op),
                             "upstream_op": op, **common})
            for up_op, op, numel, nbytes in _memory_ops(r, model):
                t, spread = _stats(r, up_op)
                rows.append({"op": op, "numel": numel, "bytes": nbytes, "time_s": t, "time_spread": spread,
                             "run_id": run_id(UPSTREAM.folder, rel, r["line"], up_op), "upstream_op": up_op,
                             **common})
    return probes_frame(rows)


def import_network(src: Path) -> pl.DataFrame:
    base = src / "data" / "profiling" / "network"
    rows: list[dict[str, Any]] = []
    for path in sorted(base.glob("*/*.csv")):
        node = path.parent.name
        hw = NETWORK_GPUS[node]
        get_gpu(hw)
        rel = str(path.relative_to(src))
        df = pl.read_csv(path).with_row_index("line", offset=2)
        coll = df["collective"][0]
        op = {"all_reduce": "all_reduce", "send_recv": "send_recv"}[coll]
        pre = f"time_stats.{coll}."
        g = (df.group_by("num_workers", "devices_per_node", "max_devices_per_node", "size", maintain_order=True)
             .agg(pl.col(pre + "median").median().alias("median"), pl.col(pre + "mean").mean().alias("mean"),
                  pl.col(pre + "std").mean().alias("std"), pl.col("line").min().alias("line"),
                  pl.len().alias("ranks_reported")))
        for r in g.iter_rows(named=True):
            n, per_node = r["num_workers"], r["devices_per_node"]
            fp = {"node_type": node, "gpu": hw, "world_size": n, "devices_per_node": per_node,
                  "nodes": -(-n // per_node), "max_devices_per_node": r["max_devices_per_node"]}
            rows.append({
                "op": op, "pass_": "comm", "dtype": DTYPE, "bytes": r["size"], "world_size": n,
                "ranks_per_node": per_node, "flops": 0.0, "time_s": r["median"] / 1000.0,
                "time_spread": r["std"] / r["mean"] if r["mean"] else None, "outcome": "ok",
                **UPSTREAM.provenance(MODULE, rel, hw, fp, {"benchmark": "torch.distributed + NCCL, kineto nccl "
                                                                         "kernel times"}),
                "run_id": run_id(UPSTREAM.folder, rel, r["line"]),
                "upstream_ref": f"{rel}:{r['line']}",
                "node_type": node, "ranks_reported": r["ranks_reported"],
            })
    return probes_frame(rows)


SECTION = """\
## Imported into perfpredict (perfpredict.importers.vidur)

One `probes.parquet` (zstd parquet) holding both parts below; no `runs` (vidur has no training steps).
run_id = hash of `vidur/<path>:<line>#<upstream op>`; `upstream_ref` names the file and line, `upstream_op` the
vidur column group, `model` the HF id and `tp` the tensor-parallel degree of the shard.

- compute/<gpu>/<model>/mlp.csv (20 files): num_tokens subsampled to about 40 log-spaced values per file (the same
  values for every TP degree; smallest and largest kept). Where a (num_tokens, tp) pair was profiled twice (2, 8 or
  20 pairs per file) the first row is kept. Each kept row gives 7 probes, all pass_ `fwd`, dtype `fp16` (vidur runs
  sarathi-serve's fp16 model code), time_s = median (ms) / 1000, time_spread = std / mean:
  - op `gemm` for attn_pre_proj (QKV), attn_post_proj (O), mlp_up_proj, mlp_down_proj with m = num_tokens and, with
    head_dim = n_embd / n_head: QKV k = n_embd, n = (n_head + 2 n_kv_head) head_dim / tp; O k = n_head head_dim / tp,
    n = n_embd; up k = n_embd, n = (2 if use_gated_mlp else 1) n_expanded_embd / tp; down k = n_expanded_embd / tp,
    n = n_embd. flops = 2 m n k.
  - memory-bound ops with numel and bytes (estimated traffic at 2 bytes/element): input_layernorm -> `rmsnorm`
    (`layernorm` for phi-2), numel = num_tokens x n_embd, bytes = 2 x numel x 2 (read + write); mlp_act -> `swiglu`
    when gated (numel = num_tokens x n_expanded_embd / tp, the output; bytes = 3 x numel x 2) else `gelu` (bytes =
    2 x numel x 2); add -> `add`, numel = num_tokens x n_embd, bytes = 3 x numel x 2. flops null. The norms are not
    sharded by TP, so their rows repeat across tp values (measured separately each time).
  - Not imported: emb, attn_rope, post_attention_layernorm (same shape as input_layernorm), and every
    attention.csv (absent from the snapshot, see above). Those would be inference attention only: upstream's
    vidur/profiling/attention/attention_wrapper.py times sarathi's paged-KV attention backend forward (prefill
    chunks or decode) under torch.inference_mode, so no forward+backward attention comes from vidur either way.
  - Hardware: a100 -> catalog `a100-sxm-80gb`, h100 -> `h100-sxm-80gb`, a40 -> `a40`. Assumption: vidur does not
    say which A100/H100 variant ran the compute profiling; the fingerprint records `catalog_assumed`.
- network/<node>/all_reduce.csv and send_recv.csv (9 files), every size kept: one probe per (num_workers,
  devices_per_node, size), time_s = median over the reported ranks of the per-rank median (only rank 0 is present
  upstream, so `ranks_reported` is 1), time_spread = std / mean. op `all_reduce` or `send_recv`, pass_ `comm`, dtype
  `fp16`, bytes = size (bytes), world_size = num_workers, ranks_per_node = devices_per_node (so a100_dgx all_reduce
  with 2 workers at 1 device per node, and 16 workers at 8, are inter-node; send_recv at 1 device per node is
  inter-node). Hardware: a100_dgx -> `a100-sxm-80gb`, h100_dgx -> `h100-sxm-80gb`, a100_pairwise_nvlink (Azure
  NC A100 v4: A100 PCIe 80GB in NVLink-bridged pairs) -> `a100-pcie-80gb`, h100_pairwise_nvlink (Azure NC H100 v5:
  H100 NVL 94GB; closest catalog entry) -> `h100-pcie-80gb`, a40_pairwise_nvlink -> `a40`; `node_type` keeps the
  upstream folder name.
- Provenance: source `vidur`, collected_at = upstream commit date 2024-11-19, license MIT.
"""


def run(shared_root: Path, out_root: Path) -> dict[str, int]:
    src = Path(shared_root) / UPSTREAM.folder
    out = Path(out_root) / UPSTREAM.folder
    probes = pl.concat([import_compute(src), import_network(src)], how="diagonal_relaxed")
    counts = write_outputs(out, {"probes": probes})
    write_source_md(src, out, SECTION)
    return counts
