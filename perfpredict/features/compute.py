"""FLOPs, communication bytes and an analytic time estimate per step and rank.

These are descriptors (features), never labels: the train stage learns the ratio of measured time to what it
composes from learned kernel models, and these columns tell it what the step is made of."""

from __future__ import annotations

import numpy as np
import polars as pl

from perfpredict.core.frameworks import runtimes_where

c = pl.col


def compute_bytes() -> pl.Expr:
    """Bytes of one element in the step's compute dtype (core.workload BYTES: 4 in fp32, 2 in bf16/fp16): what
    activations, logits and the 16-bit gradients and parameters the engines hold or move take per element. The one
    place this rule lives; a runtime that keeps something in fp32 whatever the compute dtype says so beside it
    (`pl.when(<rule>).then(4.0).otherwise(compute_bytes())`)."""
    from perfpredict.core.workload import BYTES

    return c("w_precision").replace_strict({k: float(v) for k, v in BYTES.items()}, default=2.0,
                                           return_dtype=pl.Float64)


def runtime_is(rule) -> pl.Expr:
    """Rows whose runtime (d_runtime) has rule(core.frameworks.Runtime) true: the runtime table, not names."""
    return c("d_runtime").is_in(runtimes_where(rule))


def params_on_host() -> pl.Expr:
    """Rows whose parameters live in host memory between uses: ZeRO-3 offload_param (ZeRO-Infinity), and optimizer
    offload where the runtime's only offload moves the parameters too (FSDP CPUOffload(offload_params):
    Runtime.offload_moves_params). The GPU keeps only what it gathers for the layer at work."""
    return c("p_param_offload") | (c("p_offload") & runtime_is(lambda r: r.offload_moves_params))


def runtime_value(field: str) -> pl.Expr:
    """A numeric core.frameworks.Runtime field per row, by its runtime (d_runtime); the field's default for a row
    whose runtime is not in the table."""
    from dataclasses import fields

    from perfpredict.core.frameworks import RUNTIMES, Runtime

    default = next(f.default for f in fields(Runtime) if f.name == field)
    return c("d_runtime").replace_strict({n: float(getattr(r, field)) for n, r in RUNTIMES.items()},
                                         default=float(default), return_dtype=pl.Float64)


def runtime_from_zero(field: str) -> pl.Expr:
    """Rows whose runtime's `field` (a ZeRO stage or None in the runtime table) is set and reached by p_zero."""
    from perfpredict.core.frameworks import RUNTIMES

    out = pl.lit(False)
    for name, r in RUNTIMES.items():
        stage = getattr(r, field)
        if stage is not None:
            out = out | ((c("d_runtime") == name) & (c("p_zero") >= stage))
    return out


def selective_share(field: str) -> pl.Expr:
    """Per row, what the plan framework's `recompute selective` recomputes (core.frameworks SelectiveRecompute
    `field`: gemm_fwd, attention_fwd or elementwise_fwd); Megatron's core-attention rule for unknown names."""
    from perfpredict.core.frameworks import CAPABILITIES, CORE_ATTENTION

    return c("p_framework").replace_strict({n: getattr(cap.selective, field) for n, cap in CAPABILITIES.items()},
                                           default=getattr(CORE_ATTENTION, field), return_dtype=pl.Float64)


def hf_trainer() -> pl.Expr:
    """Rows whose framework trains in transformers' Trainer loop on transformers' model code
    (core.frameworks Capability.hf_trainer)."""
    from perfpredict.core.frameworks import CAPABILITIES

    return c("p_framework").is_in([n for n, cap in CAPABILITIES.items() if cap.hf_trainer])


def no_sync_unsharded_grads() -> pl.Expr:
    """Rows that accumulate unsharded gradients over the step's micro-batches and reduce once, in the last
    (Runtime.no_sync_keeps_unsharded_grads under transformers' Trainer: accelerate's FSDP)."""
    return hf_trainer() & runtime_is(lambda r: r.no_sync_keeps_unsharded_grads) & (c("p_grad_accum") > 1)


def no_sync_grad_bytes() -> pl.Expr:
    """Bytes of the unsharded gradients those rows keep over the no_sync micro-batches: every parameter of the rank
    (before sharding, d_params_rank) in reduce_dtype, the compute dtype under accelerate's policy (fp32 for fp32
    training, else 16-bit); 0 elsewhere. One term for the generic and the TRL memory rules (features.memory
    .fsdp_gathered, features.trl.trl_memory)."""
    return pl.when(no_sync_unsharded_grads()).then(c("d_params_rank") * compute_bytes()).otherwise(0.0)


def _swap_copies() -> pl.Expr:
    """Per row, the weight copies its trainer makes to swap the reference in (core.frameworks
    reference_swap_copies), 0 where none does."""
    from perfpredict.core.frameworks import CAPABILITIES, reference_swap_copies
    from perfpredict.core.objectives import OBJECTIVES

    out = pl.lit(0.0)
    for f in CAPABILITIES:
        for o in OBJECTIVES:
            n = reference_swap_copies(f, o)
            if n:
                out = pl.when((c("p_framework") == f) & (c("w_objective") == o)).then(float(n)).otherwise(out)
    return out


def on_cpu(name: pl.Expr | None = None) -> pl.Expr:
    """Rows on a CPU host (any catalog entry of vendor "cpu"), from the hardware name column (default g_name)."""
    from perfpredict.core.catalog import cpu_names

    return (pl.col("g_name") if name is None else name).is_in(sorted(cpu_names()))


def forward_passes() -> pl.Expr:
    """Forward passes through the layers per micro-batch: the policy's, full recompute's repeat, the live (or
    offloaded) reference's, and the trainer's extra ones (features.trl: KTO's KL batch)."""
    return (1.0 + (c("p_recompute") == "full").cast(pl.Float64)
            + c("w_reference").is_in(["live", "offloaded"]).cast(pl.Float64) + c("d_extra_fwd_passes"))


def _expected_max_of_normals(n: pl.Series) -> pl.Series:
    """E[max of n independent standard normals], Blom's approximation ndtri((n - 0.375) / (n + 0.25)) (0 at n = 1;
    1.05 at n = 4 against the exact 1.03)."""
    from statistics import NormalDist

    x = n.cast(pl.Float64).clip(1.0, None).to_numpy()
    ranks = np.unique(x)  # a few distinct data-parallel widths, whatever the number of plans
    value = np.array([NormalDist().inv_cdf((r - 0.375) / (r + 0.25)) if r > 1.0 else 0.0 for r in ranks.tolist()])
    return pl.Series(value[np.searchsorted(ranks, x)], dtype=pl.Float64)


def slowest_rank_factor() -> pl.Expr:
    """Padded batches (Workload.seq_len_cv): the slowest data-parallel rank's expected padded length over the mean
    (seq_len), 1 + E[max of dp normals] x cv. Each rank pads its own micro-batch to its longest sample, and ranks
    that meet in a collective every layer wait for the slowest: ZeRO-3/FSDP gather each block (and TP / pipeline
    exchange activations) every micro-batch, so each micro-batch costs its slowest rank's length. A runtime that
    meets only at the step's gradient reduction (DDP, ZeRO 1-2) waits once per step for the slowest rank's sum over
    its grad_accum micro-batches, whose spread is cv / sqrt(grad_accum). 1 where seq_len_cv is 0 (packed or
    fixed-length sequences) or dp is 1."""
    cv = c("w_seq_len_cv").fill_null(0.0)
    per_mb = (c("p_zero") >= 3) | (c("p_tp") > 1) | (c("p_pp") > 1)
    spread = pl.when(per_mb).then(cv).otherwise(cv / c("p_grad_accum").cast(pl.Float64).sqrt())
    return 1.0 + spread * c("p_dp").map_batches(_expected_max_of_normals, return_dtype=pl.Float64)


def sp_div_ep() -> pl.Expr:
    """Sequence parallelism leaves each TP rank 1/tp of the tokens to dispatch; without it every TP rank holds all."""
    return pl.when(c("p_sp")).then(c("p_tp").cast(pl.Float64)).otherwise(1.0)


def flops(df: pl.DataFrame) -> pl.DataFrame:
    """FLOPs per step: policy forward+backward on every sequence (both of a pair), recompute's extra forward,
    the live/offloaded reference forward. The 6N rule (2N forward, 4N backward) for the matmuls plus causal
    attention 2*s*heads*head_dim per layer and token forward."""
    s = c("w_seq_len").cast(pl.Float64)
    seqs = c("w_global_batch").cast(pl.Float64) * c("w_seqs_per_sample")
    tokens = seqs * s
    attn_fwd = 2.0 * s * c("m_heads") * c("m_head_dim") * c("m_layers")
    fwd = 2.0 * c("m_matmul_params") + attn_fwd
    recompute = (pl.when(c("p_recompute") == "full").then(fwd)
                 .when(c("p_recompute") == "selective").then(
                     attn_fwd * selective_share("attention_fwd")
                     + 2.0 * c("m_matmul_params") * selective_share("gemm_fwd")).otherwise(0.0))
    ref = pl.when(c("w_reference").is_in(["live", "offloaded"])).then(fwd).otherwise(0.0)
    per_token = 3.0 * fwd + recompute + ref + c("d_extra_fwd_passes") * fwd
    n = c("c_gpus").cast(pl.Float64)
    return df.with_columns(
        d_tokens_per_step=tokens,
        d_model_flops_per_step=tokens * 3.0 * fwd,  # what MFU counts: no recompute, no reference
        d_flops_per_step=tokens * per_token,
        d_flops_per_gpu=tokens * per_token / n,
        d_attn_flops_frac=attn_fwd / fwd,
        d_precompute_flops=pl.when(c("w_reference") == "precomputed").then(
            c("w_dataset_size").cast(pl.Float64) * c("w_seqs_per_sample") * s * fwd).otherwise(0.0),
    )


def communication(df: pl.DataFrame) -> pl.DataFrame:
    """Bytes each rank moves per step, by group, as a ring moves them (all-reduce 2(n-1)/n of the buffer,
    all-gather and reduce-scatter (n-1)/n)."""
    m = c("p_grad_accum").cast(pl.Float64)
    grad_b = pl.when(runtime_is(lambda r: r.grad_reduce_fp32)
                     | (runtime_is(lambda r: r.params_as_loaded) & c("w_master_fp32"))).then(4.0).otherwise(compute_bytes())
    # Gradient sync: all-reduce (zero 0) = reduce-scatter + all-gather of updated params (zero 1/2); DeepSpeed
    # ZeRO-2/3 and FSDP reduce every micro-batch, Megatron/nanotron once per step; FSDP under transformers'
    # Trainer once per step too (its no_sync, core.frameworks Runtime.no_sync_keeps_unsharded_grads).
    per_mb_sync = runtime_from_zero("reduce_every_microbatch_from_zero") & ~no_sync_unsharded_grads()
    syncs = pl.when(per_mb_sync).then(m).otherwise(1.0)
    # Rules read several times below, as columns evaluated once (an eager with_columns evaluates a repeated
    # expression each time it appears; the same numbers).
    df = df.with_columns(_act_b=compute_bytes(), _fwd=forward_passes(), _grad_b=grad_b, _syncs=syncs,
                         _w32=runtime_is(lambda r: r.weights_fp32), _poh=params_on_host())
    act_b, grad_b, syncs = c("_act_b"), c("_grad_b"), c("_syncs")
    s = c("w_seq_len").cast(pl.Float64) / c("p_cp")
    b = c("p_micro_batch").cast(pl.Float64) * c("w_seqs_per_sample")
    sbh = s * b * c("m_hidden") * act_b
    layers = c("d_layers_max")  # the fullest pipeline stage sets the pace
    t = c("p_tp").cast(pl.Float64)
    d = (c("p_dp") * c("p_cp")).cast(pl.Float64)  # gradients reduce over dp x cp (same weights)
    ring_ar_t = 2.0 * (t - 1.0) / t
    # Megatron TP: two all-reduces per forward pass and two backward per layer (or AG+RS pairs with SP, same
    # volume); full recompute and the reference forward are forward passes too.
    tp_colls = 2.0 * c("_fwd") + 2.0
    tp_bytes = m * layers * tp_colls * sbh * ring_ar_t
    ring_d = (d - 1.0) / d
    params = c("d_params_rank")
    grad_sync = params * grad_b * ring_d * pl.when(c("p_zero") == 0).then(2.0).otherwise(1.0) * syncs
    param_gather = pl.when(c("p_zero").is_in([1, 2])).then(params * 2.0 * ring_d).otherwise(0.0)
    ref_gathers = pl.when(c("w_reference").is_in(["live"]) & (c("p_zero") >= 3)).then(1.0).otherwise(0.0)
    zero3 = pl.when(c("p_zero") >= 3).then(params * 2.0 * ring_d * m * (2.0 + ref_gathers)).otherwise(0.0)
    dp_bytes = pl.when(d > 1).then(grad_sync + param_gather + zero3).otherwise(0.0)
    sp_div = pl.when(c("p_sp")).then(t).otherwise(1.0)
    pp_bytes = pl.when(c("p_pp") > 1).then(2.0 * m * sbh / sp_div * c("p_vstages")).otherwise(0.0)
    kv = s * b * c("m_kv_heads") * c("m_head_dim") * act_b / t
    cp_ = c("p_cp").cast(pl.Float64)
    cp_bytes = pl.when(c("p_cp") > 1).then(m * layers * 3.0 * 2.0 * kv * (cp_ - 1.0)).otherwise(0.0)
    offload = pl.when(c("p_offload")).then(params / pl.when(c("p_zero") >= 1).then(d).otherwise(1.0) * 6.0).otherwise(0.0)
    # CPU Adam over the offloaded shard: ZeRO-Offload (Ren et al. 2021) reports its CPU-Adam at roughly 1 s per
    # 1e9 parameters per process; a coarse descriptor the learned correction may refine.
    cpu_adam = pl.when(c("p_offload")).then(params / pl.when(c("p_zero") >= 1).then(d).otherwise(1.0) * 1e-9).otherwise(0.0)
    # A trainer that swaps its resident weights for the reference's (NeMo-Aligner, NeMo-RL: core.frameworks
    # Trainer.reference_swap_copies) moves them three times per step, in their resident dtype and shard (FSDP2:
    # the fp32 shard); otherwise an offloaded reference streams its 16-bit weights in once.
    copies = _swap_copies()
    resident = params * pl.when(c("_w32")).then(4.0).otherwise(2.0) / pl.when(
        runtime_from_zero("reference_sharded_from_zero")).then(d).otherwise(1.0)
    ref_swap = pl.when(c("w_reference") == "offloaded").then(
        pl.when(copies > 0).then(copies * resident).otherwise(params * 2.0)).otherwise(0.0)
    # Parameters in host memory (ZeRO-Infinity, FSDP CPUOffload): each micro-batch fetches this rank's parameter
    # shard from the host for the forward and again for the backward (and the live reference's forward), in the
    # dtype the shard is kept in (FSDP's fp32 sharded parameters, DeepSpeed's 16-bit partitions).
    shard = params / pl.when(c("p_zero") >= 3).then(d).otherwise(1.0)
    fetched = pl.when(c("_w32")).then(4.0).otherwise(act_b)
    param_fetch = pl.when(c("_poh")).then(
        shard * fetched * m * (2.0 + c("w_reference").is_in(["live"]).cast(pl.Float64))).otherwise(0.0)
    # Expert parallelism: every MoE layer dispatches its tokens' top-k copies to the experts' ranks and combines
    # them back (an all-to-all each way), in every forward pass and again in the backward.
    ep = c("p_ep").cast(pl.Float64)
    ep_bytes = pl.when(ep > 1).then(
        m * layers * (2.0 * c("_fwd") + 2.0) * sbh * c("m_experts_per_token") / sp_div_ep() * (ep - 1.0) / ep
    ).otherwise(0.0)
    n_colls = (m * layers * tp_colls * pl.when(c("p_tp") > 1).then(1.0).otherwise(0.0)
               + pl.when(d > 1).then(syncs * 20.0 + pl.when(c("p_zero") >= 3).then(m * 2.0 * layers).otherwise(0.0)).otherwise(0.0)
               + pl.when(c("p_pp") > 1).then(2.0 * m * c("p_vstages")).otherwise(0.0))
    # The per-collective rules (gradient dtype, syncs per step, TP collectives per layer) are exported so the
    # kernel composition uses the same ones.
    return df.with_columns(d_grad_bytes_per_param=grad_b, d_dp_syncs=syncs, d_tp_colls_per_layer=tp_colls,
                           d_tp_bytes=tp_bytes, d_dp_bytes=dp_bytes, d_pp_bytes=pp_bytes, d_cp_bytes=cp_bytes,
                           d_ep_bytes=ep_bytes, d_host_bytes=offload + ref_swap + param_fetch, d_cpu_optim_s=cpu_adam,
                           d_collectives=n_colls).drop("_act_b", "_fwd", "_grad_b", "_syncs", "_w32", "_poh")


def placement(df: pl.DataFrame) -> pl.DataFrame:
    """Which links each group crosses, with Megatron's rank order (tp fastest, then cp, dp, pp)."""
    gpn = c("c_gpus_per_node")
    inner_dp = c("p_tp") * c("p_cp") * c("p_dp")
    cpu = on_cpu()
    return df.with_columns(
        d_tp_cross_node=(c("p_tp") > gpn),
        d_dp_cross_node=(inner_dp > gpn),
        d_pp_cross_node=(inner_dp >= gpn) & (c("c_nodes") > 1),
        d_latency_s=pl.when(cpu).then(3e-4).otherwise(1.5e-5),
    )


def analytic_time(df: pl.DataFrame) -> pl.DataFrame:
    """A roofline-style step time: compute at peak, each group's bytes over its link, the pipeline bubble.
    Kept as a baseline (what the learning must beat) and as features."""
    peak = pl.when(c("w_precision") == "fp32").then(c("g_fp32_tflops")).otherwise(c("g_bf16_tflops")) * 1e12
    intra = c("c_intra_bw_gb_per_s") * 1e9
    inter = c("c_inter_bw_gb_per_s") * 1e9
    bw = {g: pl.when(c(f"d_{g}_cross_node")).then(inter).otherwise(intra) for g in ("tp", "dp", "pp")}
    pp = c("p_pp").cast(pl.Float64)
    m = c("p_grad_accum").cast(pl.Float64) * c("p_vstages")
    bubble = pl.when(c("p_pp") > 1).then((pp - 1.0) / (m + pp - 1.0)).otherwise(0.0)
    pcie = pl.when(on_cpu()).then(10.0).otherwise(32.0) * 1e9
    return df.with_columns(
        # The fullest pipeline stage sets the pace: an uneven split runs at its largest stage's share.
        d_compute_s=c("d_flops_per_gpu") / peak * c("d_layers_max") * c("p_pp") / c("m_layers"),
        d_tp_comm_s=c("d_tp_bytes") / bw["tp"],
        d_dp_comm_s=c("d_dp_bytes") / bw["dp"],
        d_pp_comm_s=c("d_pp_bytes") / bw["pp"],
        d_cp_comm_s=c("d_cp_bytes") / intra,
        d_ep_comm_s=c("d_ep_bytes") / intra,
        d_host_s=c("d_host_bytes") / pcie + c("d_cpu_optim_s"),
        d_latency_total_s=c("d_collectives") * c("d_latency_s"),
        d_bubble_frac=bubble,
        d_optim_s=c("d_params_rank") * 16.0 * 3.0 / pl.when(c("p_zero") >= 1).then(c("p_dp") * c("p_cp")).otherwise(1)
        / (c("g_hbm_tb_per_s") * 1e12),
    ).with_columns(
        d_analytic_step_s=(c("d_compute_s") + c("d_tp_comm_s") + c("d_pp_comm_s") + c("d_cp_comm_s")
                           + c("d_ep_comm_s"))
        / (1.0 - c("d_bubble_frac")) + c("d_dp_comm_s") + c("d_host_s") + c("d_latency_total_s") + c("d_optim_s"),
    ).with_columns(
        d_comm_frac=(c("d_tp_comm_s") + c("d_dp_comm_s") + c("d_pp_comm_s") + c("d_cp_comm_s"))
        / c("d_analytic_step_s"),
    )


def compute_descriptors(df: pl.DataFrame) -> pl.DataFrame:
    for f in (flops, communication, placement, analytic_time):
        df = f(df)
    return df
