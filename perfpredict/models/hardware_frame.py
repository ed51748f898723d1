"""Hardware descriptors joined onto any frame that has a `hardware` (catalog name) column."""

from __future__ import annotations

from functools import cache

import polars as pl

from perfpredict.core.catalog import gpu_catalog


@cache
def hardware_table() -> pl.DataFrame:
    rows = []
    for g in gpu_catalog().values():
        rows.append({"hardware": g.name, "hw_bf16_tflops": g.bf16_tflops, "hw_fp16_tflops": g.fp16_tflops,
                     "hw_fp32_tflops": g.fp32_tflops, "hw_fp8_tflops": g.fp8_tflops or g.bf16_tflops,
                     "hw_hbm_tb_per_s": g.hbm_tb_per_s, "hw_intra_gb_per_s": g.intra_node_bw_gb_per_s,
                     "hw_inter_gb_per_s": g.inter_node_bw_gb_per_s, "hw_memory_gib": g.memory_gib,
                     "hw_sms": float(g.sms), "hw_l2_mib": g.l2_mib, "hw_is_cpu": g.is_cpu,
                     "hw_intra_link": g.intra_node_link, "hw_boost_clock_mhz": g.boost_clock_mhz})
    return pl.DataFrame(rows)


def with_hardware(df: pl.DataFrame) -> pl.DataFrame:
    hw = hardware_table()
    missing = set(df["hardware"].unique().to_list()) - set(hw["hardware"].to_list())
    if missing:
        from perfpredict.core.errors import PerfPredictError

        raise PerfPredictError(f"hardware {sorted(missing)} not in the GPU catalog; add a catalog entry first")
    return df.join(hw, on="hardware", how="left")
