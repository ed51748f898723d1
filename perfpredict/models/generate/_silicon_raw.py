"""PRIVATE prototype loader of the raw aiconfigurator parquet in ../shared (deleted once the importer's tables are
merged)."""
from __future__ import annotations

import functools
from pathlib import Path

import polars as pl

RAW = Path("/work/shared/data/public/aiconfigurator/data")
GPU = {"h100_sxm": "h100-sxm-80gb", "h200_sxm": "h200-sxm-141gb", "b200_sxm": "b200", "a100_sxm": "a100-sxm-80gb",
       "l40s": "l40s"}


@functools.cache
def load_raw() -> dict[str, pl.DataFrame]:
    out: dict[str, list] = {k: [] for k in ("gemm", "gen_attn", "ctx_attn", "moe", "allreduce", "nccl")}
    for folder, hw in GPU.items():
        base = RAW / folder
        if not base.is_dir():
            continue
        for f in base.glob("gemm/vllm/*/gemm_perf.parquet"):
            d = pl.read_parquet(f)
            out["gemm"].append(d.select(pl.lit(hw).alias("hardware"), pl.col("version"),
                                        pl.col("gemm_dtype").alias("dtype"), "m", "n", "k",
                                        (pl.col("latency") / 1e3).alias("time_s")))
        for f in base.glob("attention/vllm/*/generation_attention_perf.parquet"):
            d = pl.read_parquet(f)
            out["gen_attn"].append(d.select(pl.lit(hw).alias("hardware"), pl.col("batch_size").alias("batch"),
                                            pl.col("num_heads").alias("heads"),
                                            pl.col("num_key_value_heads").alias("kv_heads"), "head_dim",
                                            pl.col("kv_cache_dtype").alias("kv_dtype"),
                                            (pl.col("window_size") if "window_size" in d.columns else pl.lit(0)).alias("window"), "step",
                                            (pl.col("latency") / 1e3).alias("time_s")))
        for f in base.glob("attention/vllm/*/context_attention_perf.parquet"):
            d = pl.read_parquet(f)
            out["ctx_attn"].append(d.select(pl.lit(hw).alias("hardware"), pl.col("batch_size").alias("batch"), "isl",
                                            pl.col("num_heads").alias("heads"),
                                            pl.col("num_key_value_heads").alias("kv_heads"), "head_dim",
                                            pl.col("kv_cache_dtype").alias("kv_dtype"),
                                            (pl.col("window_size") if "window_size" in d.columns else pl.lit(0)).alias("window"),
                                            (pl.col("latency") / 1e3).alias("time_s")))
        for f in base.glob("moe/vllm/*/moe_perf.parquet"):
            d = pl.read_parquet(f)
            out["moe"].append(d.select(pl.lit(hw).alias("hardware"), pl.col("moe_dtype").alias("dtype"),
                                       pl.col("num_tokens").alias("tokens"), pl.col("hidden_size").alias("hidden"),
                                       pl.col("inter_size").alias("inter"), "topk",
                                       pl.col("num_experts").alias("experts"), pl.col("moe_tp_size").alias("moe_tp"),
                                       pl.col("moe_ep_size").alias("moe_ep"), "distribution",
                                       (pl.col("latency") / 1e3).alias("time_s")))
        for f in base.glob("comm/vllm/*/custom_allreduce_perf.parquet"):
            d = pl.read_parquet(f)
            out["allreduce"].append(d.select(pl.lit(hw).alias("hardware"), pl.col("num_gpus").alias("gpus"),
                                             pl.col("message_size").alias("bytes"), "backend",
                                             (pl.col("latency") / 1e3).alias("time_s")))
        for f in base.glob("comm/nccl/*/nccl_perf.parquet"):
            d = pl.read_parquet(f)
            out["nccl"].append(d.select(pl.lit(hw).alias("hardware"), pl.col("op_name").alias("op"),
                                        pl.col("nccl_dtype").alias("dtype"), pl.col("num_gpus").alias("gpus"),
                                        pl.col("message_size").alias("bytes"),
                                        (pl.col("latency") / 1e3).alias("time_s")))
    return {k: pl.concat(v, how="vertical_relaxed") for k, v in out.items() if v}
