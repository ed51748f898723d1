"""Every table's columns, in one place: the dataset tables collect writes and train reads (probes, runs, TRL runs,
generation runs), the descriptor frame the features stage adds, the ranking `rank` returns, and what the column
prefixes mean.

core.dataset reads and writes the dataset tables with these types; features.descriptors, predictor.rank and the
learned models' feature lists draw their names from here. No torch here."""

from __future__ import annotations

from typing import Any

import polars as pl

# What a column's prefix says it is. A flat scenario row (core.scenario.flat_row) is m_ + g_/c_ + w_ + p_; the
# features stage adds d_; the composition k_; a ranking row adds b_ and mem_.
PREFIXES = {
    "m_": "model shape (core.model: layers, hidden, heads, vocab ...)",
    "g_": "GPU / host figures of the cluster's device (core.hardware.GPUSpec)",
    "c_": "cluster layout and links (gpus, nodes, gpus per node, bandwidths)",
    "w_": "workload (core.workload: objective, sequence length, batch, reference ...)",
    "p_": "parallel plan (core.plan: tp, pp, dp, zero, micro-batch, framework ...)",
    "d_": "analytic descriptors (features): FLOPs, bytes, memory parts, analytic times",
    "k_": "kernel composition (models.compose): each part's composed seconds",
    "kc_": "the canonical plan's composed step and its part shares (models.compose)",
    "oof_": "train: out-of-fold predictions of the learned models",
    "b_": "ranking: the predicted step time broken into parts (seconds)",
    "e_": "ranking: engine terms inside those parts (seconds: exposed gathers, hooks, recompute, reference)",
    "mem_": "ranking: the peak rank's predicted memory broken into parts (GiB)",
    "f_": "learned models' derived features (models.plan_model, models.kernels)",
}

SCHEMA_VERSION = 1

PROVENANCE = {
    "source": pl.Utf8,            # "ours-cpu", "ours-gpu", "vtrain", "ultrascale_playbook", "vidur", "azure"
    "hardware": pl.Utf8,          # GPU catalog name ("cpu" for our CPU runs)
    "hardware_fingerprint": pl.Utf8,  # JSON: device name/count, memory, CPU model, cores, clocks ...
    "software": pl.Utf8,          # JSON: torch, cuda/nccl/gloo, python, perfpredict versions (or upstream's)
    "collected_at": pl.Utf8,      # ISO-8601 date/time of the measurement (upstream commit date for public data)
    "command": pl.Utf8,           # the command that produced the row (or the importer and upstream path)
    "license": pl.Utf8,           # upstream license for public data, "Apache-2.0" for ours
    "schema_version": pl.Int64,
}

PROBE_COLUMNS = {
    "op": pl.Utf8,        # gemm | attention | rmsnorm | swiglu | softmax | cross_entropy | add | adam |
                          # all_reduce | all_gather | reduce_scatter | all_to_all | send_recv | broadcast
    "pass_": pl.Utf8,     # fwd | bwd_input | bwd_weight | fwd_bwd | bwd | step | comm
    "dtype": pl.Utf8,     # bf16 | fp16 | fp32 | fp8
    "m": pl.Int64, "n": pl.Int64, "k": pl.Int64,                 # gemm: (m x k) @ (k x n)
    "batch": pl.Int64, "heads": pl.Int64, "kv_heads": pl.Int64, "seq_len": pl.Int64, "head_dim": pl.Int64,
    "numel": pl.Int64,    # memory-bound ops: elements of the main tensor
    "bytes": pl.Int64,    # collectives: message bytes per rank (nccl-tests 'size'); memory ops: bytes moved
    "world_size": pl.Int64,
    "ranks_per_node": pl.Int64,
    "flops": pl.Float64,  # useful FLOPs of the op (0 for collectives)
    "time_s": pl.Float64,     # median
    "time_spread": pl.Float64,  # coefficient of variation of the repeats (std/mean); null if unknown
    "repeats": pl.Int64,
    "outcome": pl.Utf8,   # ok | oom | timeout | error
    "error": pl.Utf8,
    # attention only (null on every other op):
    "causal": pl.Boolean,  # a causal mask was applied, so a causal kernel computed about half of QK^T and PV; `flops`
                           # counts what was computed (4*b*h*s^2*d, halved when causal; x3.5 for fwd_bwd)
    "attn_impl": pl.Utf8,  # kernel that ran: flash2 | flash3 | cudnn | mem_efficient | math | sdpa-cpu; null unknown.
                           # math = unfused matmul + softmax + matmul (scores materialised in memory); sdpa-cpu =
                           # PyTorch's fused flash-style CPU kernel (_scaled_dot_product_flash_attention_for_cpu)
}

ATTN_IMPLS = ("flash2", "flash3", "cudnn", "mem_efficient", "math", "sdpa-cpu")
# Probe ops of the `trl` family (collect.probes.trl_ops): what transformers' Llama and TRL's fused head run, timed as a
# whole beside the generic kernels. No kernel model learns from them (models.kernels skips them); models.trl_scales
# reads each against the generic kernel models' time for the same work.
TRL_OPS = ("trl_sdpa", "trl_linears", "trl_elementwise", "trl_head")

# A run's outcome. `oom` only where the source says out of memory (our harness reads the exception); a published
# failure whose cause the source does not give is `failed_unknown` (the Ultra-Scale Playbook's "crashed/oom"):
# it is neither an OOM label nor a run that fitted, and evaluation reports it apart (train.evaluate).
FAILED_UNKNOWN = "failed_unknown"
OUTCOMES = ("ok", "oom", FAILED_UNKNOWN, "timeout", "error")
# `oom_evidence` of a failed_unknown row (importers.playbook.oom_evidence): what measured runs of the same layout
# say about its memory. Evidence beside the outcome, never a label.
SIBLINGS_OVER_GPU = "siblings_over_gpu"
LARGER_MICRO_BATCH_RAN = "larger_micro_batch_ran"

LABEL_COLUMNS = {
    "run_id": pl.Utf8,
    "outcome": pl.Utf8,            # ok | oom | failed_unknown | timeout | error (see OUTCOMES)
    "error": pl.Utf8,
    "step_time_s": pl.Float64,     # median over timed steps (null unless ok)
    "step_time_cv": pl.Float64,    # coefficient of variation over timed steps
    "steps_timed": pl.Int64,
    "peak_memory_gib": pl.Float64,  # max over ranks of peak allocated tensor bytes
    "peak_memory_min_gib": pl.Float64,  # min over ranks (pipeline stages differ)
    "peak_reserved_gib": pl.Float64,   # allocator reserved (GPU) where measured
    "memory_by_rank": pl.Utf8,     # JSON list of per-rank peaks (GiB)
    "memory_kind": pl.Utf8,        # what peak_memory_gib is: cuda_max_allocated | live_tensor_peak | reported
    "tokens_per_s": pl.Float64,
    "samples_per_s": pl.Float64,   # pairs/s for preference objectives
    "oversubscribed": pl.Boolean,  # more ranks than cores: measures an overloaded CPU, not devices
    "calib_ratio": pl.Float64,     # calibration workload time after / baseline (CPU timing gate)
    "other_load_cores": pl.Float64,  # CPU used by other processes during the run
    "shrunk_from": pl.Utf8,        # catalog model the shape was shrunk from, if any
}


def probe_schema() -> dict[str, Any]:
    return {**PROBE_COLUMNS, **PROVENANCE}


# Columns collect adds to the runs and probes tables after the schema's (dataset.conform keeps extras at the end).
RUN_EXTRAS: dict[str, Any] = {
    "strategy": pl.Utf8, "attempts": pl.Int64, "calib_before_s": pl.Float64, "calib_after_s": pl.Float64,
    "calib_baseline_s": pl.Float64, "steal_cores": pl.Float64, "run_wall_s": pl.Float64, "warmup_steps": pl.Int64,
    "threads_per_rank": pl.Int64, "world_size": pl.Int64, "step_times_s": pl.Utf8, "losses": pl.Utf8,
    "rss_peak_gib": pl.Float64, "ddp_bucket_bytes": pl.Int64, "scenario_json": pl.Utf8, "sweep_seed": pl.Int64,
    "model_shape": pl.Utf8,
}
PROBE_EXTRAS: dict[str, Any] = {"threads": pl.Int64, "oversubscribed": pl.Boolean, "suite": pl.Utf8}


def runs_schema() -> dict[str, Any]:
    """The runs table collect writes (the flat scenario columns come on top, from core.scenario)."""
    return {**LABEL_COLUMNS, **PROVENANCE, **RUN_EXTRAS}


def probes_schema() -> dict[str, Any]:
    return {**probe_schema(), **PROBE_EXTRAS}


# The `trl` table (collect trl): the runs table's columns, then these.
TRL_COLUMNS: dict[str, Any] = {
    "trainer": pl.Utf8, "loss_type": pl.Utf8, "reference": pl.Utf8, "backend": pl.Utf8,
    "distributed_type": pl.Utf8, "per_device_batch": pl.Int64, "grad_accum": pl.Int64,
    "gradient_checkpointing": pl.Boolean, "padding_free": pl.Boolean, "padding_free_effective": pl.Boolean,
    "prompt_len": pl.Int64, "completion_len": pl.Int64, "len_jitter": pl.Float64, "max_length": pl.Int64,
    "dtype": pl.Utf8, "config_json": pl.Utf8,
    "batch_rows": pl.Float64, "padded_len_mean": pl.Float64, "padded_len_max": pl.Int64, "padded_len_min": pl.Int64,
    "padded_tokens_mean": pl.Float64, "real_tokens_mean": pl.Float64, "completion_tokens_mean": pl.Float64,
    "batches_seen": pl.Int64, "batch_shapes": pl.Utf8, "ref_in_memory": pl.Boolean, "construct_s": pl.Float64,
    "params_measured": pl.Int64, "base_memory_gib": pl.Float64, "rss_gib": pl.Float64,
    "competing_load_cores": pl.Float64, "end_memory_gib": pl.Float64, "net_memory_gib": pl.Float64,
    "trace": pl.Utf8,
}


def trl_schema() -> dict[str, Any]:
    return {**runs_schema(), **TRL_COLUMNS}


# The generation-runs table (generate collect: one vLLM engine session x workload per row).
GENERATE_COLUMNS: dict[str, Any] = {
    "run_id": pl.Utf8, "group_id": pl.Utf8, "engine_key": pl.Utf8, "model_shape": pl.Utf8, "outcome": pl.Utf8,
    "error": pl.Utf8, "attempts": pl.Int64, "tp": pl.Int64, "pp": pl.Int64, "replicas": pl.Int64,
    "max_num_seqs": pl.Int64, "kv_cache_memory_bytes": pl.Int64, "prefix_caching": pl.Boolean,
    "max_model_len": pl.Int64, "dtype": pl.Utf8, "workload_index": pl.Int64, "repeat": pl.Int64,
    "prompts": pl.Int64, "samples_per_prompt": pl.Int64, "input_len": pl.Int64, "output_len": pl.Int64,
    "shared_prefix_len": pl.Int64, "engine_start_s": pl.Float64, "kv_capacity_tokens": pl.Int64,
    "kv_capacity_tokens_engine": pl.Int64, "block_size": pl.Int64, "num_gpu_blocks": pl.Int64,
    "max_num_batched_tokens": pl.Int64, "wall_s": pl.Float64, "output_tokens": pl.Int64, "prompt_tokens": pl.Int64,
    "output_tokens_per_s": pl.Float64, "total_tokens_per_s": pl.Float64, "ttft_s": pl.Float64,
    "tpot_s": pl.Float64, "e2e_latency_s": pl.Float64, "preemptions": pl.Int64,
    "prefix_cache_hit_rate": pl.Float64, "replica_walls_s": pl.Utf8, "calib_before_s": pl.Float64,
    "calib_after_s": pl.Float64, "calib_baseline_s": pl.Float64, "calib_ratio": pl.Float64,
    "other_load_cores": pl.Float64, "steal_cores": pl.Float64, "gate_ok": pl.Boolean, "metrics_json": pl.Utf8,
    "sweep_seed": pl.Int64,
}

# Columns every descriptor frame has, in a stable order (the train stage's feature list is drawn from these).
DESCRIPTOR_COLUMNS = (
    "d_params_rank", "d_weight_bpp", "d_grad_bpp", "d_optim_bpp", "d_act_per_layer", "d_inflight_microbatches",
    "d_act_first", "d_act_last", "d_logits_bytes", "d_ref_weight_bytes", "d_ref_transient_bytes", "d_gathered_bytes",
    "d_ddp_bucket_bytes",
    "d_states_gib", "d_act_gib", "d_logits_gib", "d_ref_gib", "d_mem_gib", "d_mem_frac",
    "d_tokens_per_step", "d_model_flops_per_step", "d_flops_per_step", "d_flops_per_gpu", "d_attn_flops_frac",
    "d_precompute_flops", "d_grad_bytes_per_param", "d_dp_syncs", "d_tp_colls_per_layer", "d_tp_bytes",
    "d_dp_bytes", "d_pp_bytes", "d_cp_bytes", "d_host_bytes", "d_cpu_optim_s", "d_collectives",
    "d_tp_cross_node", "d_dp_cross_node", "d_pp_cross_node", "d_compute_s", "d_tp_comm_s", "d_dp_comm_s",
    "d_pp_comm_s", "d_cp_comm_s", "d_host_s", "d_latency_total_s", "d_bubble_frac", "d_optim_s",
    "d_analytic_step_s", "d_comm_frac",
)

# The step-time parts (b_*) and the peak rank's memory parts (mem_*) of a prediction; each set adds up to its total
# (step_time_s, peak_memory_gib).
STEP_TIME_PARTS = ("b_compute_s", "b_tp_comm_s", "b_dp_comm_s", "b_pp_comm_s", "b_bubble_s", "b_optimizer_s",
                   "b_stall_s")
# Engine terms inside the step-time parts (models.compose), for --explain: they overlap the parts, not add to them.
ENGINE_PARTS = ("e_zero3_gather_s", "e_zero3_hooks_s", "e_grad_reduce_s", "e_recompute_s", "e_reference_fwd_s",
                "e_hf_eager_s")
MEMORY_PARTS = ("mem_states_gib", "mem_activations_gib", "mem_logits_gib", "mem_reference_gib", "mem_other_gib")

# The OOM verdict of a plan (models.oom.verdict) and the memory outside the allocator it allows for
# (features.reserve): fits / at risk / does not fit, P(OOM), the plan's margin, the largest peak that fits.
FIT_COLUMNS = ("fit_verdict", "oom_risk", "oom_margin", "fit_limit_gib", "r_usable_gib", "r_hidden_gib",
               "r_context_gib", "r_nccl_gib")

# The pipeline-stall regime of a plan (models.stall): P(stall), the stall-free and the stalled step, their expected
# step stall_free_time_s x (1 - stall_risk) + stalled_time_s x stall_risk, and the throughput expected over the two
# regimes (what `rank` orders by: the mean of their throughputs, models.stall.expected_steps_per_s); step_time_s is
# the stall-free step unless a stall is likely (models.stall.point_time).
STALL_COLUMNS = ("stall_risk", "stall_free_time_s", "stalled_time_s", "expected_time_s", "expected_samples_per_s")

# The ranking `rank` returns (predictor.rank.Ranking.table), in this column order.
RANK_COLUMNS = (
    "rank", "plan", "p_framework", "p_tp", "p_pp", "p_dp", "p_cp", "p_sp", "p_zero", "p_micro_batch",
    "p_grad_accum", "p_recompute", "p_offload", "p_schedule", "p_vstages", "p_ep", "p_param_offload",
    "p_stage_layers", "samples_per_s", "tokens_per_s",
    "headroom_gib", "host_ram_gib",  # GPU memory minus the predicted peak; host RAM an offload plan's node pins
    "step_time_s", "step_time_lo_s", "step_time_hi_s", "time_to_finish_h", "peak_memory_gib",
    "peak_memory_lo_gib", "peak_memory_hi_gib", "fits", "mfu", "dominant", *STEP_TIME_PARTS, *ENGINE_PARTS,
    *MEMORY_PARTS,
    "g_memory_gib", *FIT_COLUMNS, *STALL_COLUMNS,
)
