"""NVIDIA AIConfigurator's measured silicon (ai-dynamo/aiconfigurator, Apache-2.0): forward GEMMs (bf16, fp8),
prefill and decode attention, fused MoE layers, NCCL collectives and vLLM's custom all-reduce, on 9 GPU types.

Each upstream table becomes one `probes_<table>.parquet` in the probe schema (so train reads every row as a kernel
probe) with the upstream key columns kept after the schema's, under their upstream names, for readers that want the
table as AIConfigurator wrote it (the vLLM generation model reads them). Latencies are milliseconds upstream,
`time_s` is seconds. Shapes are subsampled (log-spaced) so the committed files stay small."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from perfpredict.core.catalog import get_gpu
from perfpredict.core.dataset import conform, probe_schema
from perfpredict.importers.common import (
    Upstream,
    log_spaced,
    probes_frame,
    write_outputs,
    write_source_md,
)

MODULE = "aiconfigurator"
UPSTREAM = Upstream(folder="aiconfigurator", repo="ai-dynamo/aiconfigurator",
                    commit="095f58a51c4ca8e61b66ec108d86f223f8d559ce", date="2026-08-21", license="Apache-2.0",
                    software={"collector": "aiconfigurator collector (aic-core/src/aiconfigurator_core/systems)"})
# Upstream system folder -> catalog entry. All SXM parts are the HGX/DGX boards; gb200/gb300 are NVL72 trays.
GPUS = {"a100_sxm": "a100-sxm-80gb", "h100_sxm": "h100-sxm-80gb", "h200_sxm": "h200-sxm-141gb", "b200_sxm": "b200",
        "gb200": "gb200", "b300_sxm": "b300", "gb300": "gb300", "l40s": "l40s", "rtx_pro_6000_server": "rtx-pro-6000"}
MS = 1e-3
c = pl.col
# Upstream dtype names -> the probe schema's. nvfp4 and the MoE weight-only / mxfp4 modes are not imported: no plan
# here runs them, and their rates need their own peak figures.
GEMM_DTYPES = {"bfloat16": "bf16", "fp8": "fp8"}
KV_DTYPES = {"bfloat16": "bf16", "fp8": "fp8"}
MOE_DTYPES = {"bfloat16": "bf16", "fp8": "fp8"}
# fp8_block experts (128x128 block scales: vLLM's Fp8MoE Triton and FlashInfer CUTLASS kernels), the format of
# block-quantised checkpoints (Qwen3-*-FP8): imported into a file of its own, not probes*.parquet, so the kernel
# models that train reads keep their dtypes (the schema has no block-FP8 peak); only the vLLM silicon composition
# (models.generate.silicon) reads it, as `fp8_block`. The fp8_block GEMMs are not imported: below m = 1,024 they are
# 4-5x slower than bf16 on the H100 (55-85 us for 4096 x 4096: the activation quantisation and scale path), slower
# than the block-FP8 runs decode, so the composition takes the bf16 GEMM for them either way (and the datasets'
# size cap, tests/test_importers.py, is better spent elsewhere).
BLOCK_FP8 = {"fp8_block": "fp8_block"}
NCCL_DTYPES = {"half": ("fp16", 2), "int8": ("int8", 1)}
NCCL_OPS = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
            "alltoall": "all_to_all"}
# vLLM's custom all-reduce, timed inside a captured CUDA graph (decode) or eagerly (prefill beyond the capture sizes).
CUSTOM_AR_OPS = {"vllm_graph": "custom_all_reduce", "vllm_eager": "custom_all_reduce_eager"}
# Attention kernels by upstream kernel_source -> the schema's attn_impl (null where it has no name for it).
ATTN_IMPL = {"vllm_flash_attn": "flash2", "vllm_flash_attn_fa2": "flash2", "vllm_flash_attn_fa3": "flash3",
             "vllm_flash_attn_fa4": "flash4", "vllm_flashinfer_trtllmprefill": "trtllm",
             "vllm_flashinfer_trtllmdecode": "trtllm", "vllm_flashinfer_fiprefill": "flashinfer",
             "vllm_flashinfer_fidecode": "flashinfer", "vllm_triton_attn": "triton"}

# Subsampling (see SECTION): GEMM m below this are all kept (decode batch sizes), above it log-spaced.
GEMM_SMALL_M = 256
GEMM_LARGE_M = 8
GEMM_NK = 9
GEMM_MIN_NK = 128
ATTN_HEADS = 5
MOE_TOKENS = 10
# power_law_1.2 (upstream's most skewed routing) is left out: balanced and power_law_1.01 bracket real routers.
MOE_DISTRIBUTIONS = ("balanced", "power_law_1.01")


def _meta(path: Path) -> tuple[str, str]:
    """(runtime, version) from collection_meta.yaml beside a table (the folder names them too, as a fallback)."""
    meta = path.parent / "collection_meta.yaml"
    runtime, version = path.parent.parent.name, path.parent.name
    if meta.exists():
        import yaml

        d = yaml.safe_load(meta.read_text()) or {}
        rt = d.get("runtime") or {}
        runtime, version = str(rt.get("framework", runtime)), str(rt.get("version", version))
    return runtime, version


def _tables(src: Path, family: str, name: str) -> list[tuple[str, Path]]:
    """(gpu folder, path) of every copy of one upstream table; one version per GPU (SOURCE.md: the newest)."""
    out = []
    for gpu in sorted(GPUS):
        paths = sorted((src / "data" / gpu / family).glob(f"*/*/{name}.parquet"))
        out.extend((gpu, p) for p in paths)
    return out


def _read(src: Path, gpu: str, path: Path) -> pl.DataFrame:
    """One upstream table with its row number (upstream_ref), the catalog hardware and the provenance columns."""
    hw = GPUS[gpu]
    get_gpu(hw)
    rel = str(path.relative_to(src))
    runtime, version = _meta(path)
    df = pl.read_parquet(path).with_row_index("upstream_row")
    device = df["device"][0] if "device" in df.columns and df.height else gpu
    prov = UPSTREAM.provenance(MODULE, rel, hw, {"system": gpu, "device": device},
                               {"runtime": runtime, "runtime_version": version})
    return df.with_columns(
        upstream_ref=pl.lit(rel + ":") + c("upstream_row").cast(pl.Utf8),
        runtime=pl.lit(runtime), runtime_version=pl.lit(version), upstream=pl.lit(f"{UPSTREAM.repo}@{UPSTREAM.commit}"),
        time_s=c("latency") * MS, outcome=pl.lit("ok"), **{k: pl.lit(v) for k, v in prov.items()})


def _run_ids(df: pl.DataFrame) -> pl.DataFrame:
    """run_id = a hash of `aiconfigurator/<path>:<row>`, like common.run_id (vectorised: 100k rows per table)."""
    import hashlib

    ids = [hashlib.sha256(f"{UPSTREAM.folder}/{ref}".encode()).hexdigest()[:16] for ref in df["upstream_ref"]]
    return df.with_columns(run_id=pl.Series(ids, dtype=pl.Utf8))


def _finish(frames: list[pl.DataFrame], upstream_keys: list[str]) -> pl.DataFrame:
    if not frames:
        return probes_frame([])
    df = pl.concat(frames, how="diagonal_relaxed")
    df = _run_ids(df)
    extras = ["upstream_ref", "run_id", "runtime", "runtime_version", "upstream", "kernel_source", "device",
              *upstream_keys, "latency"]
    keep = [x for x in dict.fromkeys(extras) if x in df.columns]
    schema = probe_schema()
    return conform(df.select([x for x in schema if x in df.columns] + [x for x in keep if x not in schema]), schema)


def import_gemm(src: Path) -> pl.DataFrame:
    frames = []
    for gpu, path in _tables(src, "gemm", "gemm_perf"):
        df = _read(src, gpu, path).filter(c("gemm_dtype").is_in(list(GEMM_DTYPES)))
        # m: every decode-sized count (the m+1 variants upstream probes tile edges with are dropped above 16),
        # then log-spaced prefill sizes; n and k log-spaced from 128.
        ms = df["m"].unique().to_list()
        small = [m for m in ms if m <= 16 or (m <= GEMM_SMALL_M and m % 16 == 0)]
        large = log_spaced([m for m in ms if m > GEMM_SMALL_M and m % 2 == 0], GEMM_LARGE_M)
        # n, k: the powers of two from 128 (upstream's grid also has 1.5x steps and 51,200), log-spaced.
        nk = log_spaced([v for v in df["n"].unique().to_list() if v >= GEMM_MIN_NK and v & (v - 1) == 0], GEMM_NK)
        df = df.filter(c("m").is_in(small + large) & c("n").is_in(nk) & c("k").is_in(nk))
        frames.append(df.with_columns(
            op=pl.lit("gemm"), pass_=pl.lit("fwd"),
            dtype=c("gemm_dtype").replace_strict(GEMM_DTYPES, return_dtype=pl.Utf8),
            flops=2.0 * c("m").cast(pl.Float64) * c("n").cast(pl.Float64) * c("k").cast(pl.Float64)))
    return _finish(frames, ["gemm_dtype", "m", "n", "k"])


ATTN_KEYS = ["batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim", "kv_cache_dtype", "window_size",
             "step"]


def _attention(src: Path, name: str) -> list[pl.DataFrame]:
    frames = []
    for gpu, path in _tables(src, "attention", name):
        df = _read(src, gpu, path)
        if "window_size" not in df.columns:  # the A100 (vLLM 0.14) tables predate sliding windows
            df = df.with_columns(window_size=pl.lit(0, pl.Int64))
        # Full attention only (sliding windows change the work per token); query heads log-spaced.
        df = df.filter((c("window_size") == 0) & c("kv_cache_dtype").is_in(list(KV_DTYPES)))
        heads = log_spaced(df["num_heads"].unique().to_list(), ATTN_HEADS)
        df = df.filter(c("num_heads").is_in(heads))
        frames.append(df.with_columns(
            pass_=pl.lit("fwd"), dtype=c("kv_cache_dtype").replace_strict(KV_DTYPES, return_dtype=pl.Utf8),
            batch=c("batch_size"), heads=c("num_heads"), kv_heads=c("num_key_value_heads"),
            attn_impl=c("kernel_source").replace_strict(ATTN_IMPL, default=None, return_dtype=pl.Utf8)))
    return frames


def import_context_attention(src: Path) -> pl.DataFrame:
    """Prefill: `isl` new tokens per sequence attending causally to themselves (step 0: no cached prefix)."""
    frames = [f.filter(c("step") == 0).with_columns(
        op=pl.lit("attention"), seq_len=c("isl"), causal=pl.lit(True),
        flops=2.0 * c("batch_size").cast(pl.Float64) * c("num_heads") * c("isl").cast(pl.Float64) ** 2 * c("head_dim"))
        for f in _attention(src, "context_attention_perf")]
    return _finish(frames, ATTN_KEYS)


def import_generation_attention(src: Path) -> pl.DataFrame:
    """Decode: one new token per sequence attending to `step` cached tokens (seq_len = step)."""
    frames = [f.with_columns(
        op=pl.lit("decode_attention"), seq_len=c("step"), causal=pl.lit(False),
        flops=4.0 * c("batch_size").cast(pl.Float64) * c("num_heads") * c("step").cast(pl.Float64) * c("head_dim"))
        for f in _attention(src, "generation_attention_perf")]
    return _finish(frames, ATTN_KEYS)


MOE_KEYS = ["moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size",
            "distribution"]


def import_moe(src: Path, dtypes: dict[str, str] = MOE_DTYPES) -> pl.DataFrame:
    """Fused MoE layer (router excluded, gate+up and down GEMMs of the local experts), per GPU of a moe_tp x moe_ep
    group. flops = 2 x 3 x hidden x inter/tp x tokens x topk / ep (gated: gate, up and down), the balanced share."""
    frames = []
    for gpu, path in _tables(src, "moe", "moe_perf"):
        df = _read(src, gpu, path).filter(c("moe_dtype").is_in(list(dtypes))
                                          & c("distribution").is_in(list(MOE_DISTRIBUTIONS)))
        toks = log_spaced(df["num_tokens"].unique().to_list(), MOE_TOKENS)
        df = df.filter(c("num_tokens").is_in(toks))
        f64 = lambda x: c(x).cast(pl.Float64)  # noqa: E731
        frames.append(df.with_columns(
            op=pl.lit("moe"), pass_=pl.lit("fwd"),
            dtype=c("moe_dtype").replace_strict(dtypes, return_dtype=pl.Utf8),
            flops=6.0 * f64("hidden_size") * f64("inter_size") / f64("moe_tp_size") * f64("num_tokens") * f64("topk")
            / f64("moe_ep_size")))
    return _finish(frames, MOE_KEYS)


def import_nccl(src: Path) -> pl.DataFrame:
    """NCCL inside one node. `message_size` is an element count: aiconfigurator's collector/network/collect_nccl.py
    runs nccl-tests with `-b size -e size -d dtype` (bytes) and logs `message_size = size // bytes_per_element`
    (half: 2, int8: 1), and reads column 5 (out-of-place time, us) as latency / 1000. So bytes = message_size x
    element bytes, the nccl-tests `size` (all_gather: the gathered output; reduce_scatter: the input)."""
    frames = []
    for gpu, path in _tables(src, "comm", "nccl_perf"):
        df = _read(src, gpu, path).filter(c("nccl_dtype").is_in(list(NCCL_DTYPES)) & c("op_name").is_in(list(NCCL_OPS)))
        frames.append(df.with_columns(
            op=c("op_name").replace_strict(NCCL_OPS, return_dtype=pl.Utf8), pass_=pl.lit("comm"),
            dtype=c("nccl_dtype").replace_strict({k: v[0] for k, v in NCCL_DTYPES.items()}, return_dtype=pl.Utf8),
            bytes=c("message_size") * c("nccl_dtype").replace_strict({k: v[1] for k, v in NCCL_DTYPES.items()},
                                                                        return_dtype=pl.Int64),
            world_size=c("num_gpus"), ranks_per_node=c("num_gpus"), flops=pl.lit(0.0)))
    return _finish(frames, ["op_name", "nccl_dtype", "num_gpus", "message_size"])


def import_custom_allreduce(src: Path) -> pl.DataFrame:
    """vLLM's custom all-reduce (bf16). `message_size` is an element count (aiconfigurator's CustomAllReduce op
    queries it with `size = x * h`, 'count, not size in bytes'); bytes = 2 x message_size."""
    frames = []
    for gpu, path in _tables(src, "comm", "custom_allreduce_perf"):
        df = _read(src, gpu, path).filter(c("backend").is_in(list(CUSTOM_AR_OPS)))
        frames.append(df.with_columns(
            op=c("backend").replace_strict(CUSTOM_AR_OPS, return_dtype=pl.Utf8), pass_=pl.lit("comm"),
            dtype=pl.lit("bf16"), bytes=c("message_size") * 2, world_size=c("num_gpus"), ranks_per_node=c("num_gpus"),
            flops=pl.lit(0.0)))
    return _finish(frames, ["allreduce_dtype", "num_gpus", "message_size", "backend"])


TABLES = {"gemm": import_gemm, "context_attention": import_context_attention,
          "generation_attention": import_generation_attention, "moe": import_moe, "nccl": import_nccl,
          "custom_allreduce": import_custom_allreduce}


# The block-FP8 table (BLOCK_FP8): same columns and subsampling as probes_moe.
BLOCK_FP8_TABLES = {"moe": lambda src: import_moe(src, BLOCK_FP8)}


def import_all(src: Path) -> dict[str, pl.DataFrame]:
    return {**{f"probes_{name}": fn(src) for name, fn in TABLES.items()},
            **{f"fp8_block_{name}": fn(src) for name, fn in BLOCK_FP8_TABLES.items()}}


SECTION = """\
## Imported into perfpredict (perfpredict.importers.aiconfigurator)

Six `probes_<table>.parquet` files (zstd parquet), every row a probe in perfpredict's probe schema (train reads all
`probes*.parquet`), with the upstream key columns kept after the schema's under their upstream names (the vLLM
generation model reads those). Per row: `hardware` (catalog entry), `time_s` = latency (ms) / 1000, `latency` (the
upstream ms), `kernel_source`, `device`, `runtime` and `runtime_version` (from `collection_meta.yaml`), `upstream`
(repo@commit), `upstream_ref` (file:row, 0-based) and run_id = hash of `aiconfigurator/<file>:<row>`.
Provenance: source `aiconfigurator`, collected_at = upstream commit date 2026-08-21, license Apache-2.0;
hardware_fingerprint = {system folder, device string}; software = {upstream, collector, runtime, version}.

Hardware: a100_sxm -> `a100-sxm-80gb`, h100_sxm -> `h100-sxm-80gb`, h200_sxm -> `h200-sxm-141gb`, b200_sxm -> `b200`,
gb200 -> `gb200`, b300_sxm -> `b300`, gb300 -> `gb300`, l40s -> `l40s`, rtx_pro_6000_server -> `rtx-pro-6000`
(gb200, b300, gb300 and rtx-pro-6000 were added to the catalog with this import, datasheet figures cited there).

**Units (a correction to the check above).** `message_size` in both comm tables is an *element count*, not bytes:
upstream's collector/network/collect_nccl.py runs nccl-tests with `-b <bytes> -e <bytes> -d <dtype>` and logs
`message_size = size // bytes_per_element` (half 2, int8 1); its CustomAllReduce op queries `size = x * h`
("count, not size in bytes"). So the H100 8-GPU half all-reduce at message_size 268,435,456 (2.11 ms) moves
512 MiB, a bus bandwidth of 2 x 7/8 x 512 MiB / 2.11 ms = 445 GB/s (NVLink SHARP on NVSwitch), not 256 MiB at
222 GB/s; int8 rows, where elements are bytes, reach 340-350 GB/s (NVLS does not reduce int8, so NCCL rings).
`bytes` = message_size x element bytes: the nccl-tests `size` (all_gather: the gathered output; reduce_scatter and
alltoall: the per-rank input), the schema's meaning.

- probes_gemm: op `gemm`, pass_ `fwd`, gemm_dtype bfloat16 (`torch.nn.functional.linear`) -> dtype `bf16` and fp8
  (per-tensor scaled CUTLASS) -> `fp8`; fp8_block and nvfp4 rows not imported. Subsampled per GPU: every m <= 16 and
  every multiple of 16 up to 256 (decode batch sizes; upstream's m+1 tile-edge variants dropped), 8 log-spaced even m
  above 256 (up to 32,768); n and k each the 9 powers of two upstream has from 128 to 65,536 (128 ... 16,384 and
  65,536). flops = 2 m n k.
- probes_context_attention: op `attention` (prefill), pass_ `fwd`, causal, batch = batch_size, seq_len = isl,
  heads / kv_heads / head_dim as upstream, dtype = kv_cache_dtype (bf16 or fp8), attn_impl from kernel_source
  (fa2 -> flash2, fa3 -> flash3, fa4 -> flash4, flashinfer trtllm -> trtllm, flashinfer -> flashinfer, triton ->
  triton). Only window_size 0 (full attention; A100's vLLM 0.14 table has no windows), 5 log-spaced num_heads per
  GPU, every batch, isl, kv-head and head_dim. flops = 2 b heads isl^2 head_dim (causal half of 4 b h s^2 d).
  Forward only: no backward attention is measured here; see docs/kernels-accuracy.md for how backward is derived.
- probes_generation_attention: op `decode_attention` (one decode step: one query token per sequence over `step`
  cached tokens), seq_len = step, causal false, the same filters; flops = 4 b heads step head_dim.
- probes_moe: op `moe` (fused MoE layer as vLLM runs it, per GPU of a moe_tp x moe_ep group), moe_dtype bfloat16
  -> `bf16`, fp8 -> `fp8` (fp8_block in fp8_block_moe.parquet, below; other quantisations not imported), 10 log-spaced num_tokens per GPU, every shape, routing
  distributions balanced and power_law_1.01 (upstream's power_law_1.2, the most skewed, not imported). flops = 6 hidden inter/moe_tp
  num_tokens topk / moe_ep (gate, up and down projections of the balanced share). Caveat (upstream's notes):
  dummy weights bias the routing.
- probes_nccl: op all_reduce / all_gather / reduce_scatter / all_to_all (upstream alltoall), pass_ `comm`, nccl_dtype
  half -> dtype `fp16`, int8 -> `int8`, world_size = ranks_per_node = num_gpus (one node: 2, 4, 8; 2 and 4 on the
  gb200/gb300 trays), every size kept.
- probes_custom_allreduce: vLLM's custom all-reduce (bf16), op `custom_all_reduce` (backend vllm_graph: inside a
  CUDA graph, as decode runs) or `custom_all_reduce_eager` (vllm_eager), bytes = 2 x message_size, every size kept.
- fp8_block_moe.parquet: the moe_dtype `fp8_block` rows (128x128 block scales: vLLM's Fp8MoE Triton and FlashInfer
  CUTLASS experts), dtype `fp8_block`, the same columns and subsampling as probes_moe. Not named probes*: the
  schema's dtypes (and the kernel models train fits) have no block-FP8 peak; the vLLM silicon composition reads it
  for block-quantised checkpoints. The fp8_block GEMMs are not imported (slower than bf16 below m = 1,024).
"""


def run(shared_root: Path, out_root: Path) -> dict[str, int]:
    src = Path(shared_root) / UPSTREAM.folder
    out = Path(out_root) / UPSTREAM.folder
    counts = write_outputs(out, import_all(src))
    write_source_md(src, out, SECTION)
    return counts


