"""All analytic descriptors of a flat scenario frame, one row per plan. Features, never labels."""

from __future__ import annotations

import polars as pl

from perfpredict.features.compute import compute_descriptors
from perfpredict.features.memory import memory_descriptors

# Columns every descriptor frame has, in a stable order (the train stage's feature list is drawn from these).
DESCRIPTOR_COLUMNS = (
    "d_params_rank", "d_weight_bpp", "d_grad_bpp", "d_optim_bpp", "d_act_per_layer", "d_inflight_microbatches",
    "d_act_first", "d_act_last", "d_logits_bytes", "d_ref_weight_bytes", "d_ref_transient_bytes", "d_gathered_bytes",
    "d_ddp_bucket_bytes",
    "d_states_gib", "d_act_gib", "d_logits_gib", "d_ref_gib", "d_mem_gib", "d_mem_frac",
    "d_tokens_per_step", "d_model_flops_per_step", "d_flops_per_step", "d_flops_per_gpu", "d_attn_flops_frac",
    "d_precompute_flops", "d_grad_bytes_per_param", "d_dp_syncs", "d_tp_colls_per_layer", "d_tp_bytes", "d_dp_bytes", "d_pp_bytes", "d_cp_bytes", "d_host_bytes", "d_cpu_optim_s", "d_collectives",
    "d_tp_cross_node", "d_dp_cross_node", "d_pp_cross_node", "d_compute_s", "d_tp_comm_s", "d_dp_comm_s",
    "d_pp_comm_s", "d_cp_comm_s", "d_host_s", "d_latency_total_s", "d_bubble_frac", "d_optim_s",
    "d_analytic_step_s", "d_comm_frac",
)


def describe(df: pl.DataFrame) -> pl.DataFrame:
    """Flat scenario frame -> the same frame with every d_* descriptor column."""
    return compute_descriptors(memory_descriptors(df))
