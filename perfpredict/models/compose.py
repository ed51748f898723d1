"""Compose a step's time from kernel-level predictions: the ops one rank runs in one step of its plan.

Per micro-batch and layer of the slowest (last) pipeline stage: the four sharded GEMMs forward (times the forward
passes: policy, full recompute, live reference) and their two backward GEMMs, attention forward and backward,
norms/activations/residuals, then the output head and cross entropy; the TP collectives of each layer, pipeline
sends, context-parallel K/V exchange; once per step the DP gradient collectives (per micro-batch where the
framework reduces every micro-batch), ZeRO-3 parameter gathers and the optimizer step. Vectorised: queries of all
plans are deduplicated by kernel shape and predicted in one batch per family."""

from __future__ import annotations

import numpy as np
import polars as pl

from perfpredict.core.frameworks import (
    DS_PREFETCH_BUCKET_HIDDEN2,
    DS_REDUCE_BUCKET_HIDDEN2,
    EAGER_ATTENTION,
    HF_EAGER_LAYER,
    LIGER_LAYER,
    REENTRANT_REGATHER_FRAMEWORKS,
    RUNTIMES,
)
from perfpredict.features.compute import (
    forward_passes,
    hf_trainer,
    on_cpu,
    runtime_is,
    selective_share,
    slowest_rank_factor,
)
from perfpredict.features.descriptors import describe
from perfpredict.features.trl import is_trl
from perfpredict.models.hardware_frame import hardware_table
from perfpredict.models.kernels import KernelModel, family_of
from perfpredict.models.shapes import distinct_rows

c = pl.col
KERNEL_KEYS = ("hardware", "op", "pass_", "dtype", "m", "n", "k", "batch", "heads", "kv_heads", "seq_len",
               "head_dim", "numel", "bytes", "world_size", "ranks_per_node", "link_gb_per_s")
PARTS = ("compute", "tp", "pp", "cp", "ep", "dp", "zero3", "optim")
# Whether a framework overlaps the data-parallel gradient reduction with the backward pass by default.
# - megatron: Megatron-core's DistributedDataParallelConfig.overlap_grad_reduce defaults to False
#   (NVIDIA/Megatron-LM megatron/core/distributed/distributed_data_parallel_config.py); the Megatron-DeepSpeed
#   runs vTrain measured reduce after the backward.
# - nanotron wraps the model in torch DDP and lets the reducer fire in the last micro-batch's backward
#   (huggingface/nanotron src/nanotron/parallel/data_parallel/utils.py, ddp_trigger_sync_in_bwd): bucketed overlap.
# - fsdp (FSDP2 and our CPU harness's DDP) reduce-scatters / all-reduces buckets as gradients become ready.
# - deepspeed: ZeRO-2/3 reduce in buckets during backward (overlap_comm).
# - ddp (TRL on plain accelerate): torch DDP's reducer all-reduces buckets during the last micro-batch's backward.
# (core.frameworks RUNTIMES: Runtime.overlaps_grad_reduce)
OVERLAP_GRAD_REDUCE = {n: r.overlaps_grad_reduce for n, r in RUNTIMES.items()}
# torch DDP's default bucket (bucket_cap_mb=25): the last bucket's reduction cannot hide behind any backward.
LAST_BUCKET_BYTES = 25e6
# Kernels a decoder layer launches per micro-batch in eager PyTorch-based trainers: about 15 forward (norms, four
# GEMMs, rotary, attention, activation, residuals) and twice that backward; the composition times 10 of the
# forward ones and about 20 of the backward ones, the rest (rotary, reshapes, copies, casts) only cost their launch.
UNTIMED_FWD_PER_LAYER = 5.0
UNTIMED_BWD_PER_LAYER = 10.0
# Share of each compute query's time that is backward (overlap budget for the gradient reduction).
BWD_SHARE = {"bwd_input": 1.0, "bwd_weight": 1.0, "fwd_bwd": 2.5 / 3.5}
# Host dispatch + launch cost per kernel (seconds) until fitted on measured steps (calibration.LaunchFloor): eager
# trainers issue kernels one by one, and small kernels leave the GPU waiting on the host.
# How that host time meets the device's ("<class>_hidden"): on a CPU the ops run in the dispatching thread, so it
# adds (0). A GPU runs kernels asynchronously: where the host dispatches ahead of the device (no host syncs inside
# a pass), the step costs the longer of the two and dispatch hides behind device time (1); where it does not, it
# adds (0). Which one holds is fitted per trainer runtime on its measured GPU steps ("gpu:<runtime>",
# "gpu_hidden:<runtime>", with at least MIN_RUNTIME_ROWS of them): an additive floor fitted on small models' steps
# charged Megatron's large-model steps 1-3 s each for kernels that run back to back. A runtime never measured on a
# GPU gets the pooled floor (the prior below where the pooled search finds no optimum inside its grid), added:
# hiding it there made the held-out playbook (nanotron) 7 points worse when only Megatron's steps were in training,
# and an unknown runtime may sync the host anywhere.
LAUNCH_FLOOR_S = {"gpu": 2e-5, "cpu": 3e-5}
# TRL on CPU (features.trl): per-family efficiencies of the trainer's own model code against our kernel probes, and
# the scale of the fused head's torch fold (in its cross-entropy fwd+bwd units). TRL runs transformers'
# LlamaForCausalLM, not our harness's model: its SDPA gets a 4-D float mask and K/V repeated to every head
# (repeat_kv), its norms and rotary run as several eager ops. Fitted on measured TRL steps like the launch floor
# (calibration.TrlCalibration: bounded scales, one per kernel family, so each stays a physical efficiency and a step
# still moves with its own GEMM, attention and elementwise work); these defaults hold until then. GPU rows get
# none of them (TRL was not measured there).
# DeepSpeed ZeRO-3 under TRL (trl+deepspeed, stage 3): the engine's per-module hooks (fetch, release, the
# partitioned-parameter bookkeeping; deepspeed/runtime/zero/parameter_offload.py, partitioned_param_coordinator.py)
# run in Python for every parameter tensor in every pass, on one rank too, where nothing is gathered: seconds per
# parameter tensor per pass, fitted with the scales (the measured ZeRO-3 steps were 40-120 % above the composition
# without it). And every DeepSpeed stage's own per-step host work around the optimizer (engine.step: the
# gradient flatten/unflatten and all-reduce bookkeeping of ZeRO-0, the partition copies and the fp32 master step of
# ZeRO 1-2, overflow checks): seconds per optimizer step (ZeRO 0-2 steps were 20-30 % above the composition).
TRL_CALIBRATION = {"fold_scale": 1.0, "gemm_scale": 1.0, "attention_scale": 1.0, "membound_scale": 1.0,
                   "zero3_hook_s": 0.0, "deepspeed_step_s": 0.0}
TRL_FAMILIES = ("gemm", "attention", "membound")


def _matrices_per_layer() -> pl.Expr:
    """Weight matrices of a decoder layer: q, k, v, o and the MLP's two or three (gated)."""
    return 4.0 + pl.when(c("m_gated")).then(3.0).otherwise(2.0)


def _zero3_chunks() -> pl.Expr:
    """All-gather messages per layer and pass of a ZeRO-3 plan. FSDP/FSDP2 gather each wrapped decoder block in one
    message (fully_shard per block). DeepSpeed fetches per submodule and prefetches whole parameters up to
    stage3_prefetch_bucket_size (transformers' auto: 0.9 hidden^2, core.frameworks DS_PREFETCH_BUCKET_HIDDEN2), one
    all_gather_coalesced per fetch (partitioned_param_coordinator.py:285-343, 380-413): about a layer over the
    bucket messages, at most one per weight matrix. Smaller messages run the link below its bandwidth (the
    collective model's latency term)."""
    bucket = DS_PREFETCH_BUCKET_HIDDEN2 * c("m_hidden").cast(pl.Float64) ** 2
    per_bucket = (c("m_layer_params").cast(pl.Float64) / bucket).clip(1.0, None)
    return pl.when(runtime_is(lambda r: r.zero3_prefetch_buckets)).then(
        pl.min_horizontal(per_bucket, _matrices_per_layer()).round(0)).otherwise(1.0)


def _regathers() -> pl.Expr:
    """1 where each ZeRO-3 block is gathered once more per micro-batch for its recompute (plan reentrant_checkpoint
    under full recompute on an FSDP1 framework: core.frameworks REENTRANT_REGATHER_FRAMEWORKS), else 0."""
    on = (c("p_reentrant_checkpoint").fill_null(False) & (c("p_recompute") == "full") & (c("p_zero") >= 3)
          & c("p_framework").is_in(list(REENTRANT_REGATHER_FRAMEWORKS)))
    return on.cast(pl.Float64)


def _hf_eager_units() -> tuple[pl.Expr, pl.Expr]:
    """16-bit element moves per token and forward of transformers' eager layer beyond the fused kernels timed here
    (core.frameworks HF_EAGER_LAYER), in units of the hidden size and of the MLP width: on GPU rows of frameworks
    that run transformers' model code (Capability.hf_trainer), 0 elsewhere; a plan with Liger's kernels
    (fused_head: core.frameworks LIGER_LAYER) keeps only what Liger leaves to transformers. On a CPU host the TRL
    calibration (calibration.TrlCalibration, membound_scale) already measures that code."""
    h = c("m_hidden").cast(pl.Float64)
    q, k = (c("m_heads") * c("m_head_dim")).cast(pl.Float64) / h, (c("m_kv_heads") * c("m_head_dim")).cast(pl.Float64) / h
    gqa = (c("m_kv_heads") < c("m_heads")).cast(pl.Float64)
    liger = c("p_fused_head").fill_null(False)

    def pick(field: str) -> pl.Expr:
        return pl.when(liger).then(getattr(LIGER_LAYER, field)).otherwise(getattr(HF_EAGER_LAYER, field))

    per_h = (pick("norm_extra") + pick("rotary") * (q + k) + gqa * pick("repeat_kv") * 2.0 * (q + k)
             + pick("attn_out_copy") * q)
    on = (hf_trainer() & ~on_cpu()).cast(pl.Float64)
    return on * per_h, on * pick("mlp_extra")


def _i(e: pl.Expr) -> pl.Expr:
    return e.round(0).cast(pl.Int64).clip(lower_bound=1)


def _base(df: pl.DataFrame) -> pl.DataFrame:
    seqs = c("p_micro_batch") * c("w_seqs_per_sample")
    # Padded batches: the step runs at the slowest data-parallel rank's padded length (features.compute
    # slowest_rank_factor; seq_len as given where the workload states no spread).
    if "w_seq_len_cv" not in df.columns:
        df = df.with_columns(w_seq_len_cv=pl.lit(0.0))
    s_eff = c("w_seq_len").cast(pl.Float64) * slowest_rank_factor()
    T = seqs.cast(pl.Float64) * s_eff / c("p_cp")
    ref = c("w_reference").is_in(["live", "offloaded"]).cast(pl.Float64)
    sel = (c("p_recompute") == "selective").cast(pl.Float64)
    eager_h, eager_f = _hf_eager_units()
    full = (c("p_recompute") == "full").cast(pl.Float64)
    moe = c("m_experts") > 0
    f = pl.when(moe).then(c("m_expert_ffn")).otherwise(c("m_ffn")).cast(pl.Float64)
    gpn = c("c_gpus_per_node")
    act_b = pl.when(c("w_precision") == "fp32").then(4).otherwise(2)
    return df.with_row_index("row").select(
        "row",
        hardware=c("g_name"), dtype=c("w_precision"),
        T=T, Lps=c("d_layers_max"), mbs=c("p_grad_accum").cast(pl.Float64),
        # What `recompute selective` recomputes is the framework's (core.frameworks SelectiveRecompute): Megatron's
        # core attention, torchtitan's every second matmul and the elementwise ops.
        fwd_mult=forward_passes(), sel_gemm=sel * selective_share("gemm_fwd"),
        sel_elem=sel * selective_share("elementwise_fwd"),
        attn_fwd_extra=forward_passes() - 1.0 + sel * selective_share("attention_fwd"), ref=ref,
        rc_full=full, rc_attn=sel * selective_share("attention_fwd"),
        z3_chunks=_zero3_chunks(), regather=_regathers(),
        eager_h=eager_h, eager_f=eager_f,
        # transformers' eager attention (plan eager_attention): its materialised scores, wherever the plan runs it.
        eager_attn=c("p_eager_attention").fill_null(False).cast(pl.Float64),
        # DeepSpeed reduces gradients in buckets of reduce_bucket_size elements (transformers' auto: hidden^2).
        rs_chunks=pl.when(runtime_is(lambda r: r.zero3_prefetch_buckets)).then(
            (c("d_params_rank") / (DS_REDUCE_BUCKET_HIDDEN2 * c("m_hidden").cast(pl.Float64) ** 2)).clip(1.0, None)
            .round(0)).otherwise(1.0),
        head_fwd=c("d_head_fwd_passes"), head_ce=c("d_head_ce_passes"), head_fold=c("d_head_fold_ce"),
        h=c("m_hidden").cast(pl.Float64), a=c("m_heads").cast(pl.Float64), kv=c("m_kv_heads").cast(pl.Float64),
        hd=c("m_head_dim").cast(pl.Float64), t=c("p_tp").cast(pl.Float64), V=c("m_vocab").cast(pl.Float64),
        f=f, gate=pl.when(c("m_gated")).then(2.0).otherwise(1.0),
        # Expert parallelism: a rank runs its experts/ep experts on the tokens routed to them from ep ranks.
        experts=pl.when(moe).then(c("m_experts") / c("p_ep")).otherwise(1).cast(pl.Float64),
        # An expert-parallel group's ranks sit tp apart (TP innermost): Megatron-core builds its expert groups with
        # expert tensor parallelism = tp by default and the order tp-cp-ep-dp-pp (NVIDIA/Megatron-LM
        # megatron/core/parallel_state.py:617, 871-872, 887-893 at d98e8a64), so ep ranks span ep x tp GPUs, ep_rpn
        # of them per node; beyond a node the all-to-all crosses the inter-node link.
        ep=c("p_ep"), ep_rpn=pl.max_horizontal(pl.lit(1), pl.min_horizontal(c("p_ep"), gpn // c("p_tp"))),
        ep_tokens=T * pl.when(moe).then(
            c("m_experts_per_token")).otherwise(0).cast(pl.Float64) / pl.when(c("p_sp")).then(c("p_tp")).otherwise(1),
        ep_link=pl.when(c("p_ep") * c("p_tp") > gpn).then(c("c_inter_bw_gb_per_s")).otherwise(c("c_intra_bw_gb_per_s")),
        topk=pl.when(moe).then(c("m_experts_per_token")).otherwise(1).cast(pl.Float64),
        seqs=seqs.cast(pl.Float64), s=s_eff, cp=c("p_cp").cast(pl.Float64),
        tp=c("p_tp"), dp=c("p_dp") * c("p_cp"), pp=c("p_pp"), cpi=c("p_cp"), zero=c("p_zero"), sp=c("p_sp"),
        vst=c("p_vstages").cast(pl.Float64), act_b=act_b,
        params=c("d_params_rank"), layer_params=c("m_layer_params").cast(pl.Float64),
        grad_b=c("d_grad_bytes_per_param"), syncs=c("d_dp_syncs"),
        tp_rpn=pl.min_horizontal(c("p_tp"), gpn),
        dp_rpn=pl.max_horizontal(pl.lit(1), pl.min_horizontal(c("p_dp") * c("p_cp"), gpn // c("p_tp"))),
        pp_rpn=pl.when(c("d_pp_cross_node")).then(1).otherwise(2),
        tp_colls=c("d_tp_colls_per_layer"),
        tp_link=pl.when(c("d_tp_cross_node")).then(c("c_inter_bw_gb_per_s")).otherwise(c("c_intra_bw_gb_per_s")),
        dp_link=pl.when(c("d_dp_cross_node")).then(c("c_inter_bw_gb_per_s")).otherwise(c("c_intra_bw_gb_per_s")),
        pp_link=pl.when(c("d_pp_cross_node")).then(c("c_inter_bw_gb_per_s")).otherwise(c("c_intra_bw_gb_per_s")),
        cp_link=c("c_intra_bw_gb_per_s"),
        # Sequence parallelism shards the norms, residual adds (and dropout) along the sequence over tp.
        T_sp=T / pl.when(c("p_sp")).then(c("p_tp")).otherwise(1).cast(pl.Float64),
    )


def _gemms(b: pl.DataFrame) -> list[pl.DataFrame]:
    Tm = c("T") * c("topk") / c("experts")
    shapes = {  # name: (m, k, n, count per layer)
        "qkv": (c("T"), c("h"), (c("a") + 2 * c("kv")) * c("hd") / c("t"), pl.lit(1.0)),
        "o": (c("T"), c("a") * c("hd") / c("t"), c("h"), pl.lit(1.0)),
        "up": (Tm, c("h"), c("gate") * c("f") / c("t"), c("experts")),
        "down": (Tm, c("f") / c("t"), c("h"), c("experts")),
    }
    out = []
    for m, k, n, cnt in shapes.values():
        per = cnt * c("Lps") * c("mbs")
        out += [
            b.select("row", "hardware", "dtype", m=_i(m), n=_i(n), k=_i(k), pass_=pl.lit("fwd"),
                     count=per * (c("fwd_mult") + c("sel_gemm")), rc=per * (c("rc_full") + c("sel_gemm")),
                     rf=per * c("ref")),
            b.select("row", "hardware", "dtype", m=_i(m), n=_i(k), k=_i(n), pass_=pl.lit("bwd_input"), count=per),
            b.select("row", "hardware", "dtype", m=_i(k), n=_i(n), k=_i(m), pass_=pl.lit("bwd_weight"), count=per),
        ]
    # Output head on the last stage: forward for the policy (and the reference; TRL's fused head recomputes it in
    # the backward, features.trl.head_passes), two backward GEMMs.
    head_n = c("V") / c("t")
    out += [
        b.select("row", "hardware", "dtype", m=_i(c("T")), n=_i(head_n), k=_i(c("h")), pass_=pl.lit("fwd"),
                 count=c("mbs") * c("head_fwd"), rf=c("mbs") * c("ref")),
        b.select("row", "hardware", "dtype", m=_i(c("T")), n=_i(c("h")), k=_i(head_n), pass_=pl.lit("bwd_input"),
                 count=c("mbs")),
        b.select("row", "hardware", "dtype", m=_i(c("h")), n=_i(head_n), k=_i(c("T")), pass_=pl.lit("bwd_weight"),
                 count=c("mbs")),
    ]
    return [g.with_columns(op=pl.lit("gemm"), part=pl.lit("compute")) for g in out]


def _attention(b: pl.DataFrame) -> list[pl.DataFrame]:
    # Context parallelism: each rank attends s/cp queries over all s keys, 1/cp of the work; a probe of length
    # s/sqrt(cp) does the same work.
    seq = _i(c("s") / c("cp").sqrt())
    common = dict(op=pl.lit("attention"), batch=_i(c("seqs")), heads=_i(c("a") / c("t")), kv_heads=_i(c("kv") / c("t")), seq_len=seq,
                  head_dim=_i(c("hd")))
    # transformers' eager attention multiplies the whole s x s square (the causal mask is added to the scores, not
    # skipped: core.frameworks EAGER_ATTENTION): twice the causal kernel's FLOPs, timed at its efficiency.
    sq = 1.0 + c("eager_attn")
    per = c("Lps") * c("mbs") * sq
    return [
        b.select("row", "hardware", "dtype", **common, pass_=pl.lit("fwd_bwd"), count=per),
        b.select("row", "hardware", "dtype", **common, pass_=pl.lit("fwd"), count=per * c("attn_fwd_extra"),
                 rc=per * (c("rc_full") + c("rc_attn")), rf=per * c("ref")),
    ]


def _membound(b: pl.DataFrame) -> list[pl.DataFrame]:
    # Backward of an elementwise op moves about twice its forward bytes.
    passes = c("fwd_mult") + c("sel_elem") + 2.0
    per = c("Lps") * c("mbs")
    rc, rf = c("rc_full") + c("sel_elem"), c("ref")
    return [
        b.select("row", "hardware", "dtype", op=pl.lit("rmsnorm"), numel=_i(c("T_sp") * c("h")), count=2.0 * per * passes,
                 rc=2.0 * per * rc, rf=2.0 * per * rf),
        b.select("row", "hardware", "dtype", op=pl.lit("swiglu"),
                 numel=_i(c("T") * c("topk") * c("f") / c("t")), count=per * passes, rc=per * rc, rf=per * rf),
        b.select("row", "hardware", "dtype", op=pl.lit("add"), numel=_i(c("T_sp") * c("h")), count=2.0 * per * passes,
                 rc=2.0 * per * rc, rf=2.0 * per * rf),
        b.select("row", "hardware", "dtype", op=pl.lit("cross_entropy"), numel=_i(c("T") * c("V") / c("t")),
                 count=c("mbs") * c("head_ce")),
        # transformers' eager layer ops on a GPU (_hf_eager_units), timed as 'add' kernels (3 moves per element)
        # moving the same bytes: the fp32 RMSNorm chain, rotary, repeat_kv and copies on [T, h], SiLU and product
        # on the MLP's [T, ffn].
        # `eg` marks the whole count as eager-op work (its launches are not kernel counts: _kernel_parts).
        *[b.filter(c(u) > 0).select("row", "hardware", "dtype", op=pl.lit("add"), numel=_i(n),
                                    count=per * passes * c(u) / 3.0, rc=per * rc * c(u) / 3.0,
                                    rf=per * rf * c(u) / 3.0).with_columns(eg=c("count"))
          for u, n in (("eager_h", c("T_sp") * c("h")), ("eager_f", c("T") * c("topk") * c("f") / c("t")))],
        # transformers' eager attention (core.frameworks EAGER_ATTENTION): the score matrix [seqs, heads/tp, s, s/cp]
        # written, scaled, masked, softmaxed in fp32, cast back and read in every forward (policy, recompute, live
        # reference) and its backward, timed as 'add' kernels (3 moves per element) moving the same bytes; the score
        # GEMMs' FLOPs stay in the attention queries above.
        b.filter(c("eager_attn") > 0).select(
            "row", "hardware", "dtype", op=pl.lit("add"), numel=_i(c("seqs") * c("a") / c("t") * c("s") * c("s") / c("cp")),
            count=c("Lps") * c("mbs") * ((c("attn_fwd_extra") + 1.0) * EAGER_ATTENTION.fwd_per_score
                                         + EAGER_ATTENTION.bwd_per_score) / 3.0,
            rc=c("Lps") * c("mbs") * (c("rc_full") + c("rc_attn")) * EAGER_ATTENTION.fwd_per_score / 3.0,
            rf=c("Lps") * c("mbs") * c("ref") * EAGER_ATTENTION.fwd_per_score / 3.0).with_columns(eg=c("count")),
        # TRL's fused head on CPU (features.trl.head_passes): its torch fold, in cross-entropy fwd+bwd units,
        # scaled by the fitted calibration (calibration.TrlCalibration).
        b.filter(c("head_fold") > 0).select("row", "hardware", "dtype", op=pl.lit("cross_entropy"),
                                            pass_=pl.lit("fwd_bwd"), numel=_i(c("T") * c("V") / c("t")),
                                            count=c("mbs") * c("head_fold"), part=pl.lit("trlfold")),
    ]


def _comm(b: pl.DataFrame) -> list[pl.DataFrame]:
    sbh = c("T") * c("h") * c("act_b")
    grad_bytes = c("params") * c("grad_b")
    kw = dict(dtype=pl.lit("bf16"))
    out = [
        # TP: all-reduces of the layer's activations. With sequence parallelism each becomes an all-gather plus a
        # reduce-scatter of the same buffer: the same bytes on the wire (Korthikanti et al. 2022, section 4.2.2),
        # which is what a ring all-reduce runs anyway (reduce-scatter then all-gather). They are timed as the
        # all-reduce so the separately learned efficiencies of the three ops cannot make SP look twice as fast.
        b.filter(c("tp") > 1).select(
            "row", "hardware", op=pl.lit("all_reduce"), bytes=_i(sbh), world_size=c("tp"), ranks_per_node=c("tp_rpn"),
            link_gb_per_s=c("tp_link"), count=c("Lps") * c("mbs") * c("tp_colls"), part=pl.lit("tp"), **kw),
        b.filter(c("pp") > 1).select("row", "hardware", op=pl.lit("send_recv"),
                                     bytes=_i(sbh / pl.when(c("sp")).then(c("t")).otherwise(1.0)),
                                     world_size=pl.lit(2, dtype=pl.Int64), ranks_per_node=c("pp_rpn").cast(pl.Int64),
                                     link_gb_per_s=c("pp_link"), count=2.0 * c("mbs") * c("vst"), part=pl.lit("pp"), **kw),
        b.filter(c("cpi") > 1).select("row", "hardware", op=pl.lit("send_recv"),
                                      bytes=_i(2.0 * c("T") * c("kv") * c("hd") * c("act_b") / c("t")),
                                      world_size=pl.lit(2, dtype=pl.Int64), ranks_per_node=pl.lit(2, dtype=pl.Int64),
                                      link_gb_per_s=c("cp_link"), count=3.0 * c("Lps") * c("mbs") * (c("cp") - 1.0), part=pl.lit("cp"), **kw),
        b.filter((c("dp") > 1) & (c("zero") == 0)).select(
            "row", "hardware", op=pl.lit("all_reduce"), bytes=_i(grad_bytes), world_size=c("dp"),
            ranks_per_node=c("dp_rpn"), link_gb_per_s=c("dp_link"), count=c("syncs"), part=pl.lit("dp"), **kw),
        # Gradient reduce-scatters: DeepSpeed in reduce buckets (z3_rs_chunks messages), others one per sync.
        b.filter((c("dp") > 1) & (c("zero") >= 1)).select(
            "row", "hardware", op=pl.lit("reduce_scatter"), bytes=_i(grad_bytes / c("rs_chunks")), world_size=c("dp"),
            ranks_per_node=c("dp_rpn"), link_gb_per_s=c("dp_link"), count=c("syncs") * c("rs_chunks"),
            part=pl.lit("dp"), **kw),
        # ZeRO-1/2 gather the updated parameters after the optimizer step: nothing left to hide it behind.
        b.filter((c("dp") > 1) & c("zero").is_in([1, 2])).select(
            "row", "hardware", op=pl.lit("all_gather"), bytes=_i(c("params") * 2.0), world_size=c("dp"),
            ranks_per_node=c("dp_rpn"), link_gb_per_s=c("dp_link"), count=pl.lit(1.0), part=pl.lit("dpgather"), **kw),
        # ZeRO-3 / FSDP parameter gathers: per layer and pass (forward, backward, the live reference's forward, an
        # FSDP1 block's recompute under reentrant checkpointing: _regathers), in
        # the engine's messages (z3_chunks per layer: FSDP one per wrapped block, DeepSpeed one per prefetch bucket).
        b.filter((c("dp") > 1) & (c("zero") >= 3)).select(
            "row", "hardware", op=pl.lit("all_gather"), bytes=_i(c("layer_params") * 2.0 / c("t") / c("z3_chunks")),
            world_size=c("dp"), ranks_per_node=c("dp_rpn"), link_gb_per_s=c("dp_link"),
            count=c("Lps") * c("mbs") * (2.0 + c("ref") + c("regather")) * c("z3_chunks"), part=pl.lit("zero3"),
            **kw),
    ]
    return out


def _expert_parallel(b: pl.DataFrame) -> list[pl.DataFrame]:
    """MoE dispatch and combine across the ep group: one all-to-all each way per layer and forward pass, and the
    two again in the backward; each moves this rank's routed token copies (top-k of them) at activation width."""
    return [b.filter(c("ep") > 1).select(
        "row", "hardware", op=pl.lit("all_to_all"), dtype=pl.lit("bf16"),
        bytes=_i(c("ep_tokens") * c("h") * c("act_b")), world_size=c("ep"), ranks_per_node=c("ep_rpn"),
        link_gb_per_s=c("ep_link"), count=c("Lps") * c("mbs") * (2.0 * c("fwd_mult") + 2.0), part=pl.lit("ep"))]


def _optimizer(b: pl.DataFrame) -> list[pl.DataFrame]:
    shard = pl.when(c("zero") >= 1).then(c("dp")).otherwise(1).cast(pl.Float64)
    return [b.select("row", "hardware", op=pl.lit("adam"), dtype=pl.lit("fp32"), numel=_i(c("params") / shard),
                     count=pl.lit(1.0), part=pl.lit("optim"))]


def kernel_queries(desc: pl.DataFrame) -> pl.DataFrame:
    """Every kernel one rank runs in a step, for each plan row of a descriptor frame (with its count)."""
    q = _queries(_base(desc))
    return q.with_columns(family=_families(q["op"]))


def _families(op: pl.Series) -> pl.Series:
    """kernels.family_of per row, each distinct op's once."""
    return op.replace_strict({o: family_of(o) for o in op.unique().to_list()}, return_dtype=pl.Utf8)


# The _base columns the compute kernels (_gemms, _attention, _membound) read: a rank's work shape. Plans that differ
# only in how they communicate share it, and _kernel_parts builds and sums their compute queries once per shape.
# Those functions get only these columns, so one that reads another fails at once (add it here), never silently.
COMPUTE_INPUTS = ("hardware", "dtype", "T", "T_sp", "Lps", "mbs", "V", "a", "kv", "hd", "h", "f", "gate", "t",
                  "experts", "topk", "seqs", "s", "cp", "fwd_mult", "attn_fwd_extra", "head_ce", "head_fold",
                  "head_fwd", "ref", "rc_attn", "rc_full", "sel_elem", "sel_gemm", "eager_h", "eager_f", "eager_attn")


def _queries(b: pl.DataFrame, work: pl.DataFrame | None = None) -> pl.DataFrame:
    """kernel_queries from _base's columns, which are all they read, less the family (_kernel_parts finds each
    distinct kernel's, kernel_queries each row's); the compute kernels from `work` (rows of COMPUTE_INPUTS with
    their own row ids) where given."""
    # The kernel functions build lazy frames, collected once as one query: ~40 small selects each paid polars'
    # fixed cost per call, which at a ranking's size was most of their time.
    w = (b if work is None else work).lazy()
    lb = b.lazy()
    frames = _gemms(w) + _attention(w) + _membound(w) + _comm(lb) + _expert_parallel(lb) + _optimizer(lb)
    # Every frame that names its part names it by a literal, so a null part is a frame that names none: compute
    # (one expression where asking each frame's schema resolved ~40 plans).
    q = pl.concat(frames, how="diagonal_relaxed").with_columns(part=c("part").fill_null("compute"))
    have = q.collect_schema().names()
    return q.with_columns(pl.lit(None, dtype=pl.Float64 if k == "link_gb_per_s" else pl.Int64).alias(k)
                          for k in KERNEL_KEYS if k not in have).collect()


def launch_floor_s(hardware: pl.Expr, floors: dict[str, float], key: str = "") -> pl.Expr:
    """Host dispatch and launch time per kernel (key "_hidden": the share of device time it hides behind), by
    device class and, on a GPU, by the trainer runtime where one was fitted."""
    per_rt = {k.split(":", 1)[1]: v for k, v in floors.items() if k.startswith(f"gpu{key}:")}
    gpu = pl.lit(floors.get(f"gpu{key}", 0.0))
    if per_rt:
        gpu = c("d_runtime").replace_strict(per_rt, default=gpu, return_dtype=pl.Float64)
    return pl.when(on_cpu(hardware)).then(floors.get(f"cpu{key}", 0.0)).otherwise(gpu)


def _exposed(comm: pl.Expr, hide_behind: pl.Expr, tail: pl.Expr) -> pl.Expr:
    """Communication left exposed when it overlaps `hide_behind`: what exceeds it, and at least the tail that
    starts after the last computation it could hide behind. Non-decreasing in `comm`, so a slower link is never
    faster."""
    return pl.max_horizontal(comm - hide_behind, comm * tail.clip(0.0, 1.0))


def canonical_frame(desc: pl.DataFrame) -> pl.DataFrame:
    """The same plans with the knobs whose effect physics (the composition) decides set to a reference value:
    no sequence parallelism, no recompute, a precomputed reference, one micro-batch per step, the catalog's
    link bandwidths. The learned correction reads its features from this frame, so it is the same number for a
    plan with and without SP, at any bandwidth, and those knobs move the prediction exactly as the composition
    says (recompute, the reference and the number of micro-batches enter the correction only through features
    it is constrained to be non-decreasing in)."""
    return describe(_canonical_flat(desc))


def _canonical_flat(desc: pl.DataFrame) -> pl.DataFrame:
    """canonical_frame before its descriptors are recomputed."""
    hw = hardware_table().select(g_name="hardware", _intra="hw_intra_gb_per_s", _inter="hw_inter_gb_per_s")
    # The catalog's links joined on the hardware column alone, in the rows' order (joining and re-sorting the
    # whole frame copied every column twice); catalog names are unique (core.catalog keys its entries by name), so
    # the join keeps one row per row.
    links = desc.select("g_name").join(hw, on="g_name", how="left", maintain_order="left")
    flat = desc.with_columns(links["_intra"], links["_inter"]).with_columns(
        p_sp=pl.lit(False), p_recompute=pl.lit("none"),
        w_reference=pl.when(c("w_reference").is_in(["live", "offloaded"])).then(pl.lit("precomputed"))
        .otherwise(c("w_reference")),
        p_grad_accum=pl.lit(1, dtype=desc.schema["p_grad_accum"]),
        w_global_batch=(c("p_dp") * c("p_micro_batch")).cast(desc.schema["w_global_batch"]),
        c_intra_bw_gb_per_s=pl.coalesce(c("_intra"), c("c_intra_bw_gb_per_s")),
        c_inter_bw_gb_per_s=pl.coalesce(c("_inter"), c("c_inter_bw_gb_per_s")),
    ).drop("_intra", "_inter")
    return flat


def canonical_plans(flat: pl.DataFrame) -> tuple[pl.DataFrame, np.ndarray]:
    """The distinct canonical plans of a frame's rows (canonical_frame before describe: its scenario columns alone
    tell them apart) and, per row, the index of its own."""
    cflat = _canonical_flat(flat)
    return distinct_rows(cflat, [k for k in cflat.columns if not k.startswith(("d_", "k_", "kc_"))])


def compose(desc: pl.DataFrame, kernels: KernelModel, *, launch_floor: dict[str, float] | None = None,
            trl_calibration: dict[str, float] | None = None, canonical: bool = True,
            canon: tuple[pl.DataFrame, np.ndarray] | None = None) -> pl.DataFrame:
    """Adds k_<part>_s for each part and k_step_s (the composed step time) to a descriptor frame, and (with
    `canonical`) kc_<part>_frac, the shares of the canonical plan's composed step (see canonical_frame). The
    launch floor and the TRL calibration are the fitted values a bundle carries (calibration.LaunchFloor's
    floors_, calibration.TrlCalibration's calibration_; keys it lacks keep TRL_CALIBRATION's); None: the
    defaults, LAUNCH_FLOOR_S and TRL_CALIBRATION. `canon`: the rows' canonical plans already described, as
    canonical_plans gives them (described) and each row's index among them (a ranking describes them together
    with its plans: one pass of descriptors instead of two)."""
    floors = launch_floor or LAUNCH_FLOOR_S
    cal = {**TRL_CALIBRATION, **(trl_calibration or {})}
    if not canonical:
        return _compose(desc, kernels, floors, cal)
    # Many plans share one canonical plan: each distinct one is described and composed once (models.shapes). The
    # descriptors are recomputed from the scenario columns, so those alone tell canonical plans apart.
    if canon is None:
        shapes, of_row = canonical_plans(desc)
        canon = describe(shapes)
    else:
        canon, of_row = canon
    try:  # the plans and their canonical plans ask the kernel models together: one query, one prediction each
        both = _assemble(_kernel_parts(pl.concat([desc, canon.select(desc.columns)], how="vertical"), kernels),
                         floors, cal)
        out, canon = both.head(desc.height), both.tail(canon.height)
    except (pl.exceptions.SchemaError, pl.exceptions.ColumnNotFoundError):  # a frame the canonical one differs from
        out, canon = _compose(desc, kernels, floors, cal), _compose(canon, kernels, floors, cal)
    canon = canon.select("k_step_s", *[f"k_{p}_frac" for p in (*PARTS, "launch")])[of_row]  # gather what is read
    return out.with_columns(
        kc_step_s=canon["k_step_s"], **{f"kc_{p}_frac": canon[f"k_{p}_frac"] for p in (*PARTS, "launch")})


def _trl_cpu() -> pl.Expr:
    """The plans TRL_CALIBRATION applies to: TRL on CPU, where it was measured."""
    return is_trl() & on_cpu()


def trl_scale(cal: dict[str, float], key: str) -> pl.Expr:
    """One TRL scale per row: the host's own, measured by its TRL-op probes (models.trl_scales, keys
    "<key>@<hardware>"), else the fitted constant `cal[key]`."""
    own = {k.split("@", 1)[1]: v for k, v in cal.items() if k.startswith(f"{key}@")}
    if not own:
        return pl.lit(cal.get(key, TRL_CALIBRATION[key]))
    return c("g_name").replace_strict(own, default=cal.get(key, TRL_CALIBRATION[key]), return_dtype=pl.Float64)


def _deepspeed_steps() -> pl.Expr:
    """1 for a TRL DeepSpeed plan on CPU (its engine's per-step host work), 0 elsewhere."""
    return (_trl_cpu() & runtime_is(lambda r: r.engine_step_host_work)).cast(pl.Float64)


def _zero3_hook_units(*, gpu: bool = False) -> pl.Expr:
    """Parameter tensors x passes per optimizer step of a DeepSpeed ZeRO-3 plan (0 elsewhere): per layer the
    four attention projections, two or three MLP matrices and two norms; the embedding, the final norm and an
    untied head. gpu=False: TRL plans on CPU (where the hook cost was fitted); gpu=True: every DeepSpeed ZeRO-3
    plan on a GPU, TRL or not (the engine's hooks are the same Python on the host: parameter_offload.py registers
    them on every submodule, partitioned_param_coordinator.py fetch_sub_module / release_sub_module run in them).
    On one layer's worth the pipeline stage holds (d_layers_max), since that is the rank's own work."""
    if gpu:
        z3 = runtime_is(lambda r: r.zero3_prefetch_buckets) & (c("p_zero") >= 3) & ~on_cpu()
        layers = c("d_layers_max").cast(pl.Float64)
    else:
        z3 = (_deepspeed_steps() > 0) & (c("p_zero") >= 3)
        layers = c("m_layers").cast(pl.Float64)
    per_layer = 2.0 + _matrices_per_layer()
    tensors = layers * per_layer + 2.0 + pl.when(c("m_tied")).then(0.0).otherwise(1.0)
    # Passes through the layers per micro-batch: TRL's own count (features.trl), else the forwards (policy,
    # full recompute, reference) and the backward.
    passes = pl.when(c("d_layer_passes").fill_null(0.0) > 0).then(c("d_layer_passes")).otherwise(
        forward_passes() + 1.0)
    return pl.when(z3).then(tensors * passes * c("p_grad_accum").cast(pl.Float64)).otherwise(0.0)


def _compose(desc: pl.DataFrame, kernels: KernelModel, floors: dict[str, float],
             cal: dict[str, float] | None = None) -> pl.DataFrame:
    return _assemble(_kernel_parts(desc, kernels), floors, cal)


def _kernel_parts(desc: pl.DataFrame, kernels: KernelModel) -> pl.DataFrame:
    """desc with each part's raw kernel seconds (k_<part>_raw_s), its backward share and timed-kernel count: the
    kernel models' work, which no launch floor or calibration changes (the grid searches reuse it)."""
    # Each row's communication queries are its own: a ranking's rows repeat in _base about 1 % of the time (the
    # canonical plans that are plans themselves), so deduplicating whole rows cost more than it saved. Their compute
    # kernels are composed once per work shape (models.shapes; ids n.. after the n rows' own).
    shapes = _base(desc).drop("row")
    n = shapes.height
    tasks, of_task = distinct_rows(shapes.select(COMPUTE_INPUTS))
    q = _queries(shapes.with_row_index("row"), tasks.with_row_index("row", offset=n))
    ids = q["row"].cast(pl.Int64).to_numpy()
    # Each distinct kernel is predicted once; a group lists the queries that ask for it. The work shapes' queries
    # (ids n.., first in q) and the rows' own are grouped apart, each on the keys it fills: a key null throughout a
    # set tells none of its queries apart, and one group_by over ~100k queries and every key cost twice as much.
    # The family is a function of the op: found per group (~1k), spread to the queries by their group.
    n_work = int((ids >= n).sum())
    assert (ids[:n_work] >= n).all(), "_queries lists the work shapes' queries first"
    groups: list[pl.DataFrame] = []
    of_group = np.empty(q.height, dtype=np.int64)
    for start, part in ((0, q.head(n_work)), (n_work, q.slice(n_work))):
        if not part.height:
            continue
        nulls = [part.get_column(k).null_count() for k in KERNEL_KEYS]  # each column's own count: no query
        keys = [k for k, v in zip(KERNEL_KEYS, nulls, strict=True) if v < part.height]
        g = part.select(keys).with_row_index("_q").group_by(keys).agg("_q")
        first = sum(x.height for x in groups)
        of_group[start + g["_q"].explode().to_numpy()] = np.repeat(np.arange(first, first + g.height),
                                                                   g["_q"].list.len().to_numpy())
        groups.append(g.select(pl.col(k) if k in keys else pl.lit(None, dtype=q.schema[k]).alias(k)
                               for k in KERNEL_KEYS))
    kinds = pl.concat(groups)
    kinds = kinds.with_columns(family=_families(kinds["op"]))
    kt = kernels.predict_remembered(kinds)[of_group]
    # Each row's sums, added up per row id in numpy (a group_by over ~100k queries cost more than the whole sum), from
    # numpy columns of the queries (polars' fixed cost per expression was most of this at a ranking's size): the
    # parts and the TRL families by one bincount each over (row id, part) and (row id, family) cells, which adds each
    # cell's queries in the same order as a bincount per column with 0 elsewhere (x + 0.0 == x: the same sums). A
    # null count or backward share counts 0, as polars' fill_null did.
    parts, fams = (*PARTS, "dpgather", "trlfold"), TRL_FAMILIES

    def codes(col: pl.Series, names: tuple[str, ...]) -> np.ndarray:
        return col.replace_strict({v: i for i, v in enumerate(names)}, default=-1, return_dtype=pl.Int64
                                  ).fill_null(-1).to_numpy()

    def floats(col: str) -> np.ndarray:
        return q[col].cast(pl.Float64).fill_null(0.0).to_numpy() if col in q.columns else np.zeros(q.height)

    part, fam = codes(q["part"], parts), codes(kinds["family"], fams)[of_group]
    timed = part == parts.index("compute")
    count_null = q["count"].is_null().to_numpy()
    count, rc, rf, eg = floats("count"), floats("rc"), floats("rf"), floats("eg")
    work_q = np.where(count_null, 0.0, kt * count)
    share = q["pass_"].replace_strict(BWD_SHARE, default=0.0, return_dtype=pl.Float64)
    membound = fam == fams.index("membound")
    bwd_null = timed & ~membound & share.is_null().to_numpy()
    bwd = np.where(timed, np.where(membound, 0.5, share.fill_null(0.0).to_numpy()), 0.0) * work_q
    per_query = {
        "k_bwd_s": np.where(bwd_null, 0.0, bwd),
        # Kernel launches: the eager-op queries are byte equivalents, not kernel counts; their launches stay in
        # UNTIMED_FWD/BWD_PER_LAYER (the launch floor is fitted on those counts).
        "n_timed": np.where(timed & ~count_null, count - eg, 0.0),
        # Of the compute: recompute's forward work and the live reference's forward (engine terms for --explain).
        "k_recompute_s": np.where(timed, kt * rc, 0.0),
        "k_reference_s": np.where(timed, kt * rf, 0.0),
        "k_hf_eager_s": np.where(timed, kt * eg, 0.0),
    }
    rows = n + tasks.height
    fam = np.where(timed, fam, -1)

    def cells(code: np.ndarray, width: int) -> np.ndarray:
        on = code >= 0
        return np.bincount(ids[on] * width + code[on], weights=work_q[on], minlength=rows * width).reshape(rows, width)

    columns = [f"k_{p}_raw_s" for p in parts] + list(per_query) + [f"k_{f}_s" for f in fams]
    sums = np.column_stack([cells(part, len(parts))]
                           + [np.bincount(ids, weights=v, minlength=rows) for v in per_query.values()]
                           + [cells(fam, len(fams))])
    # A row's communication parts from its own id, its compute parts from its work shape's (each 0 on the other).
    sums = sums[:n] + sums[n + of_task]
    return desc.hstack(pl.DataFrame({k: sums[:, i] for i, k in enumerate(columns)}))


def _assemble(out: pl.DataFrame, floors: dict[str, float], cal: dict[str, float] | None = None) -> pl.DataFrame:
    """The step from _kernel_parts: launch floor, overlaps, TRL calibration, bubble."""
    cal = {**TRL_CALIBRATION, **(cal or {})}
    n_untimed = (c("p_grad_accum") * c("d_layers_max")
                 * (UNTIMED_FWD_PER_LAYER * forward_passes() + UNTIMED_BWD_PER_LAYER))
    overlap = c("d_runtime").replace_strict(OVERLAP_GRAD_REDUCE, default=False, return_dtype=pl.Boolean)
    grad_bytes = (c("d_params_rank") * c("d_grad_bytes_per_param")).clip(lower_bound=1.0)
    per_mb_bwd = c("k_bwd_s") / c("p_grad_accum")
    # ZeRO-3 / FSDP prefetch the next layer's (DeepSpeed: the next bucket's) parameters while the current one
    # computes; the first gather of each pass waits (tail).
    tail = c("p_pp") / c("m_layers").cast(pl.Float64)
    last_bucket = (LAST_BUCKET_BYTES / grad_bytes).clip(0.0, 1.0)
    # Where gradients reduce during the backward (overlap) at ZeRO-3, the backward's parameter gathers and the
    # gradient reduce-scatters share the data-parallel link and the backward to hide behind: FSDP2 runs them on
    # two streams (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py FSDPCommContext.lazy_init:
    # all_gather_stream "overlapping next all-gather with current forward compute", reduce_scatter_stream), and
    # DeepSpeed on its allgather stream and reduce_and_partition_stream (stage3.py:1275-1330) with at most two
    # reduce buckets in flight before the host waits (:1305-1308). The forward's gathers (policy and live
    # reference) hide behind the forward only.
    ref = c("w_reference").is_in(["live", "offloaded"]).cast(pl.Float64)
    # A recompute's own gather (_regathers) runs in the backward, beside the backward's.
    rg = _regathers()
    g_f = c("k_zero3_raw_s") * (1.0 + ref) / (2.0 + ref + rg)
    g_b = c("k_zero3_raw_s") * (1.0 + rg) / (2.0 + ref + rg)
    rs = c("k_dp_raw_s")
    shared = overlap & (c("p_zero") >= 3) & (c("k_zero3_raw_s") > 0)
    exp_f = _exposed(g_f, c("k_compute_raw_s") - c("k_bwd_s"), tail)
    exp_b = pl.max_horizontal(g_b + rs - c("k_bwd_s"), g_b * tail.clip(0.0, 1.0) + rs * last_bucket)
    split = g_b / (g_b + rs).clip(lower_bound=1e-30)
    # One lazy query, collected at the end (each eager step paid polars' fixed cost per call).
    out = out.lazy().with_columns(
        k_host_s=(n_untimed + c("n_timed")) * launch_floor_s(c("g_name"), floors),
        k_dp_s=pl.when(shared).then(exp_b * (1.0 - split)).when(overlap).then(
            _exposed(c("k_dp_raw_s"), per_mb_bwd * c("d_dp_syncs"), last_bucket))
        .otherwise(c("k_dp_raw_s")) + c("k_dpgather_raw_s"),
        k_zero3_s=pl.when(shared).then(exp_f + exp_b * split).otherwise(
            _exposed(c("k_zero3_raw_s"), c("k_compute_raw_s"), tail)),
        # The first gather of each pass, which nothing hides: the host waits for it too (below).
        k_zero3_wait_s=c("k_zero3_raw_s") * tail.clip(0.0, 1.0),
        **{f"k_{p}_s": c(f"k_{p}_raw_s") for p in PARTS if p not in ("dp", "zero3")},
    ).drop([f"k_{p}_raw_s" for p in (*PARTS, "dpgather")] + ["n_timed"])
    # What runs on the device in a stage; evaluated where used (the stage below sees TRL's calibrated compute).
    device = c("k_compute_s") + c("k_tp_s") + c("k_cp_s") + c("k_ep_s")
    hidden = launch_floor_s(c("g_name"), floors, "_hidden").clip(0.0, 1.0)
    out = out.with_columns(k_launch_s=(c("k_host_s") - hidden * device).clip(lower_bound=0.0)).drop("k_host_s")
    trl_cpu = _trl_cpu()
    extra = sum((trl_scale(cal, f"{f}_scale") - 1.0) * c(f"k_{f}_s") for f in TRL_FAMILIES)
    out = out.with_columns(
        k_trlfold_unit_s=c("k_trlfold_raw_s"),
        k_trl_s=c("k_trlfold_raw_s") * trl_scale(cal, "fold_scale") + cal["zero3_hook_s"] * _zero3_hook_units()
        + cal["deepspeed_step_s"] * _deepspeed_steps(),
        k_compute_s=c("k_compute_s") + pl.when(trl_cpu).then(extra).otherwise(0.0),
    ).drop("k_trlfold_raw_s")
    # DeepSpeed ZeRO-3's per-module hooks on a GPU host: Python on the host while the kernels run asynchronously,
    # so they cost only what the device cannot cover, its kernels and its waits for exposed gathers and reductions
    # (at micro-batch 1 a module's GEMMs are shorter than its hooks; larger micro-batches hide them). The host is
    # held near the device by the coordinator's waits on at most two in-flight fetches
    # (partitioned_param_coordinator.py:329-332) and reduce buckets (stage3.py:1305-1308); the step's totals are
    # compared, a lower bound of the per-module max. Seconds per parameter tensor and pass: the host cost fitted on
    # our CPU host's ZeRO-3 steps (calibration.TrlCalibration zero3_hook_s), the same Python on a GPU host (an
    # overestimate where the GPU host's CPU is faster; TensorAuto/OpenTau#177 reports such hooks dominating GPU
    # steps of models with many small tensors).
    # The first gather of each pass blocks the hook that fetches it (fetch_sub_module waits on its own module's
    # parameters, :321-343), so that wait covers no host work.
    budget = device + (c("k_zero3_s") + c("k_dp_s") - c("k_zero3_wait_s")).clip(lower_bound=0.0)
    out = out.with_columns(
        k_hook_s=(cal["zero3_hook_s"] * _zero3_hook_units(gpu=True) - budget).clip(lower_bound=0.0)
    ).drop("k_zero3_wait_s")
    stage = device + c("k_pp_s") + c("k_launch_s")
    return out.with_columns(
        k_step_s=stage / (1.0 - c("d_bubble_frac")) + c("k_dp_s") + c("k_zero3_s") + c("k_optim_s") + c("d_host_s")
        + c("k_trl_s") + c("k_hook_s"),
    ).with_columns(
        k_bubble_s=stage * c("d_bubble_frac") / (1.0 - c("d_bubble_frac")),
        **{f"k_{p}_frac": c(f"k_{p}_s") / c("k_step_s") for p in (*PARTS, "launch")},
    ).collect()
