"""Compose a step's time from kernel-level predictions: the ops one rank runs in one step of its plan.

Per micro-batch and layer of the slowest (last) pipeline stage: the four sharded GEMMs forward (times the forward
passes: policy, full recompute, live reference) and their two backward GEMMs, attention forward and backward,
norms/activations/residuals, then the output head and cross entropy; the TP collectives of each layer, pipeline
sends, context-parallel K/V exchange; once per step the DP gradient collectives (per micro-batch where the
framework reduces every micro-batch), ZeRO-3 parameter gathers and the optimizer step. Vectorised: queries of all
plans are deduplicated by kernel shape and predicted in one batch per family."""

from __future__ import annotations

import polars as pl

from perfpredict.features.compute import forward_passes
from perfpredict.predictor.kernels import KernelModel, family_of

c = pl.col
KERNEL_KEYS = ("hardware", "op", "pass_", "dtype", "m", "n", "k", "batch", "heads", "kv_heads", "seq_len",
               "head_dim", "numel", "bytes", "world_size", "ranks_per_node")
PARTS = ("compute", "tp", "pp", "cp", "ep", "dp", "zero3", "optim")
# Kernels a decoder layer launches per micro-batch in eager PyTorch-based trainers: about 15 forward (norms, four
# GEMMs, rotary, attention, activation, residuals) and twice that backward. Each costs a launch/dispatch floor
# whatever its size (about 10 us on a GPU, more through the CPU dispatcher): small models and micro-batches are
# bound by it, which kernel timings taken in isolation do not show.
KERNELS_FWD_PER_LAYER = 15.0
KERNELS_BWD_PER_LAYER = 30.0


def _i(e: pl.Expr) -> pl.Expr:
    return e.round(0).cast(pl.Int64).clip(lower_bound=1)


def _base(df: pl.DataFrame) -> pl.DataFrame:
    seqs = c("p_micro_batch") * c("w_seqs_per_sample")
    T = seqs.cast(pl.Float64) * c("w_seq_len") / c("p_cp")
    ref = c("w_reference").is_in(["live", "offloaded"]).cast(pl.Float64)
    sel = (c("p_recompute") == "selective").cast(pl.Float64)
    moe = c("m_experts") > 0
    f = pl.when(moe).then(c("m_expert_ffn")).otherwise(c("m_ffn")).cast(pl.Float64)
    gpn = c("c_gpus_per_node")
    act_b = pl.when(c("w_precision") == "fp32").then(4).otherwise(2)
    return df.with_row_index("row").select(
        "row",
        hardware=c("g_name"), dtype=c("w_precision"),
        T=T, Lps=c("d_layers_max"), mbs=c("p_grad_accum").cast(pl.Float64),
        fwd_mult=forward_passes(), attn_fwd_extra=forward_passes() - 1.0 + sel, ref=ref,
        h=c("m_hidden").cast(pl.Float64), a=c("m_heads").cast(pl.Float64), kv=c("m_kv_heads").cast(pl.Float64),
        hd=c("m_head_dim").cast(pl.Float64), t=c("p_tp").cast(pl.Float64), V=c("m_vocab").cast(pl.Float64),
        f=f, gate=pl.when(c("m_gated")).then(2.0).otherwise(1.0),
        # Expert parallelism: a rank runs its experts/ep experts on the tokens routed to them from ep ranks.
        experts=pl.when(moe).then(c("m_experts") / c("p_ep")).otherwise(1).cast(pl.Float64),
        ep=c("p_ep"), ep_rpn=pl.min_horizontal(c("p_ep"), gpn), ep_tokens=T * pl.when(moe).then(
            c("m_experts_per_token")).otherwise(0).cast(pl.Float64) / pl.when(c("p_sp")).then(c("p_tp")).otherwise(1),
        topk=pl.when(moe).then(c("m_experts_per_token")).otherwise(1).cast(pl.Float64),
        seqs=seqs.cast(pl.Float64), s=c("w_seq_len").cast(pl.Float64), cp=c("p_cp").cast(pl.Float64),
        tp=c("p_tp"), dp=c("p_dp") * c("p_cp"), pp=c("p_pp"), cpi=c("p_cp"), zero=c("p_zero"), sp=c("p_sp"),
        vst=c("p_vstages").cast(pl.Float64), act_b=act_b,
        params=c("d_params_rank"), layer_params=c("m_layer_params").cast(pl.Float64),
        grad_b=c("d_grad_bytes_per_param"), syncs=c("d_dp_syncs"),
        tp_rpn=pl.min_horizontal(c("p_tp"), gpn),
        dp_rpn=pl.max_horizontal(pl.lit(1), pl.min_horizontal(c("p_dp") * c("p_cp"), gpn // c("p_tp"))),
        pp_rpn=pl.when(c("d_pp_cross_node")).then(1).otherwise(2),
        tp_colls=c("d_tp_colls_per_layer"),
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
            b.select("row", "hardware", "dtype", m=_i(m), n=_i(n), k=_i(k), pass_=pl.lit("fwd"), count=per * c("fwd_mult")),
            b.select("row", "hardware", "dtype", m=_i(m), n=_i(k), k=_i(n), pass_=pl.lit("bwd_input"), count=per),
            b.select("row", "hardware", "dtype", m=_i(k), n=_i(n), k=_i(m), pass_=pl.lit("bwd_weight"), count=per),
        ]
    # Output head on the last stage: forward for the policy (and the reference), two backward GEMMs.
    head_n = c("V") / c("t")
    out += [
        b.select("row", "hardware", "dtype", m=_i(c("T")), n=_i(head_n), k=_i(c("h")), pass_=pl.lit("fwd"),
                 count=c("mbs") * (1.0 + c("ref"))),
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
    return [
        b.select("row", "hardware", "dtype", **common, pass_=pl.lit("fwd_bwd"), count=c("Lps") * c("mbs")),
        b.select("row", "hardware", "dtype", **common, pass_=pl.lit("fwd"),
                 count=c("Lps") * c("mbs") * c("attn_fwd_extra")),
    ]


def _membound(b: pl.DataFrame) -> list[pl.DataFrame]:
    # Backward of an elementwise op moves about twice its forward bytes.
    passes = c("fwd_mult") + 2.0
    per = c("Lps") * c("mbs")
    return [
        b.select("row", "hardware", "dtype", op=pl.lit("rmsnorm"), numel=_i(c("T") * c("h")), count=2.0 * per * passes),
        b.select("row", "hardware", "dtype", op=pl.lit("swiglu"),
                 numel=_i(c("T") * c("topk") * c("f") / c("t")), count=per * passes),
        b.select("row", "hardware", "dtype", op=pl.lit("add"), numel=_i(c("T") * c("h")), count=2.0 * per * passes),
        b.select("row", "hardware", "dtype", op=pl.lit("cross_entropy"), numel=_i(c("T") * c("V") / c("t")),
                 count=c("mbs") * (3.0 + c("ref"))),
    ]


def _comm(b: pl.DataFrame) -> list[pl.DataFrame]:
    sbh = c("T") * c("h") * c("act_b")
    grad_bytes = c("params") * c("grad_b")
    kw = dict(dtype=pl.lit("bf16"))
    out = [
        b.filter(c("tp") > 1).select("row", "hardware", op=pl.lit("all_reduce"), bytes=_i(sbh), world_size=c("tp"),
                                     ranks_per_node=c("tp_rpn"), count=c("Lps") * c("mbs") * c("tp_colls"),
                                     part=pl.lit("tp"), **kw),
        b.filter(c("pp") > 1).select("row", "hardware", op=pl.lit("send_recv"),
                                     bytes=_i(sbh / pl.when(c("sp")).then(c("t")).otherwise(1.0)),
                                     world_size=pl.lit(2, dtype=pl.Int64), ranks_per_node=c("pp_rpn").cast(pl.Int64),
                                     count=2.0 * c("mbs") * c("vst"), part=pl.lit("pp"), **kw),
        b.filter(c("cpi") > 1).select("row", "hardware", op=pl.lit("send_recv"),
                                      bytes=_i(2.0 * c("T") * c("kv") * c("hd") * c("act_b") / c("t")),
                                      world_size=pl.lit(2, dtype=pl.Int64), ranks_per_node=pl.lit(2, dtype=pl.Int64),
                                      count=3.0 * c("Lps") * c("mbs") * (c("cp") - 1.0), part=pl.lit("cp"), **kw),
        b.filter((c("dp") > 1) & (c("zero") == 0)).select(
            "row", "hardware", op=pl.lit("all_reduce"), bytes=_i(grad_bytes), world_size=c("dp"),
            ranks_per_node=c("dp_rpn"), count=c("syncs"), part=pl.lit("dp"), **kw),
        b.filter((c("dp") > 1) & (c("zero") >= 1)).select(
            "row", "hardware", op=pl.lit("reduce_scatter"), bytes=_i(grad_bytes), world_size=c("dp"),
            ranks_per_node=c("dp_rpn"), count=c("syncs"), part=pl.lit("dp"), **kw),
        b.filter((c("dp") > 1) & c("zero").is_in([1, 2])).select(
            "row", "hardware", op=pl.lit("all_gather"), bytes=_i(c("params") * 2.0), world_size=c("dp"),
            ranks_per_node=c("dp_rpn"), count=pl.lit(1.0), part=pl.lit("dp"), **kw),
        b.filter((c("dp") > 1) & (c("zero") >= 3)).select(
            "row", "hardware", op=pl.lit("all_gather"), bytes=_i(c("layer_params") * 2.0 / c("t")),
            world_size=c("dp"), ranks_per_node=c("dp_rpn"),
            count=c("Lps") * c("mbs") * (2.0 + c("ref")), part=pl.lit("zero3"), **kw),
    ]
    return out


def _expert_parallel(b: pl.DataFrame) -> list[pl.DataFrame]:
    """MoE dispatch and combine across the ep group: one all-to-all each way per layer and forward pass, and the
    two again in the backward; each moves this rank's routed token copies (top-k of them) at activation width."""
    return [b.filter(c("ep") > 1).select(
        "row", "hardware", op=pl.lit("all_to_all"), dtype=pl.lit("bf16"),
        bytes=_i(c("ep_tokens") * c("h") * c("act_b")), world_size=c("ep"), ranks_per_node=c("ep_rpn"),
        count=c("Lps") * c("mbs") * (2.0 * c("fwd_mult") + 2.0), part=pl.lit("ep"))]


def _optimizer(b: pl.DataFrame) -> list[pl.DataFrame]:
    shard = pl.when(c("zero") >= 1).then(c("dp")).otherwise(1).cast(pl.Float64)
    return [b.select("row", "hardware", op=pl.lit("adam"), dtype=pl.lit("fp32"), numel=_i(c("params") / shard),
                     count=pl.lit(1.0), part=pl.lit("optim"))]


def kernel_queries(desc: pl.DataFrame) -> pl.DataFrame:
    """Every kernel one rank runs in a step, for each plan row of a descriptor frame (with its count)."""
    b = _base(desc)
    frames = _gemms(b) + _attention(b) + _membound(b) + _comm(b) + _expert_parallel(b) + _optimizer(b)
    frames = [f if "part" in f.columns else f.with_columns(part=pl.lit("compute")) for f in frames]
    q = pl.concat(frames, how="diagonal_relaxed")
    for k in KERNEL_KEYS:
        if k not in q.columns:
            q = q.with_columns(pl.lit(None, dtype=pl.Int64).alias(k))
    return q.with_columns(family=c("op").replace_strict(
        {o: family_of(o) for o in q["op"].unique().to_list()}, return_dtype=pl.Utf8))


def compose(desc: pl.DataFrame, kernels: KernelModel) -> pl.DataFrame:
    """Adds k_<part>_s for each part and k_step_s (the composed step time) to a descriptor frame."""
    q = kernel_queries(desc)
    keys = list(KERNEL_KEYS) + ["family"]
    uniq = q.select(keys).unique()
    prepared = kernels.prepare(uniq)
    uniq = uniq.with_columns(kt=pl.Series(kernels.predict_prepared(prepared)))
    q = q.join(uniq, on=keys, how="left", nulls_equal=True)
    parts = (q.group_by("row", "part").agg(s=(c("kt") * c("count")).sum())
             .pivot(on="part", index="row", values="s"))
    for p in PARTS:
        if p not in parts.columns:
            parts = parts.with_columns(pl.lit(0.0).alias(p))
    parts = parts.select("row", *[c(p).fill_null(0.0).alias(f"k_{p}_s") for p in PARTS])
    out = desc.with_row_index("row").join(parts, on="row", how="left").drop("row")
    out = out.with_columns([c(f"k_{p}_s").fill_null(0.0) for p in PARTS])
    launch = pl.when(c("g_name") == "cpu").then(3e-5).otherwise(2e-5)
    n_kernels = (c("p_grad_accum") * c("d_layers_max")
                 * (KERNELS_FWD_PER_LAYER * forward_passes() + KERNELS_BWD_PER_LAYER))
    out = out.with_columns(k_launch_s=n_kernels * launch)
    stage = c("k_compute_s") + c("k_tp_s") + c("k_cp_s") + c("k_ep_s") + c("k_pp_s") + c("k_launch_s")
    return out.with_columns(
        k_step_s=stage / (1.0 - c("d_bubble_frac")) + c("k_dp_s") + c("k_zero3_s") + c("k_optim_s") + c("d_host_s"),
    ).with_columns(
        k_bubble_s=stage * c("d_bubble_frac") / (1.0 - c("d_bubble_frac")),
        **{f"k_{p}_frac": c(f"k_{p}_s") / c("k_step_s") for p in (*PARTS, "launch")},
    )


