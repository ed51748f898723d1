"""Kernel-level models: GEMM, attention, memory-bound ops and collectives.

Each family predicts log(measured time / roofline time), where the roofline comes from the hardware's datasheet
figures. Learning the efficiency rather than the time lets a GPU with few probes borrow from the others: its
roofline already carries its peak rates, and the model only learns how far below them a shape runs."""

from __future__ import annotations

import numpy as np
import polars as pl

from perfpredict.core.schema import TRL_OPS
from perfpredict.models.gb import GBRegressor
from perfpredict.models.hardware_frame import with_hardware

c = pl.col
FAMILIES = ("gemm", "attention", "membound", "collective", "decode_attention", "moe")
MEMBOUND_OPS = ("rmsnorm", "layernorm", "swiglu", "gelu", "softmax", "cross_entropy", "add", "adam", "copy")
# vLLM's custom all-reduce (inside a CUDA graph, and eager) comes last so the f_op codes of the others stay put.
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast",
               "custom_all_reduce", "custom_all_reduce_eager")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1, "int8": 1}
PASSES = ("fwd", "bwd_input", "bwd_weight", "fwd_bwd", "bwd", "step", "comm")
# Bytes each membound op moves per element of its main tensor (reads + writes, 16-bit), as implemented unfused.
MEMBOUND_TRAFFIC = {"rmsnorm": 2.0, "layernorm": 2.0, "swiglu": 3.0, "gelu": 2.0, "softmax": 2.0,
                    "cross_entropy": 3.0, "add": 3.0, "adam": 8.0, "copy": 2.0}


def family_of(op: str) -> str:
    """gemm | attention (prefill / training, causal over the sequence) | decode_attention (one query token per
    sequence over a KV cache: bandwidth-bound, a kernel of its own) | moe (a fused MoE layer) | collective |
    membound."""
    if op in ("gemm", "attention", "decode_attention", "moe"):
        return op
    if op in COLLECTIVES:
        return "collective"
    return "membound"


def _peak_tflops() -> pl.Expr:
    return (pl.when(c("dtype") == "fp32").then(c("hw_fp32_tflops"))
            .when(c("dtype") == "fp8").then(c("hw_fp8_tflops"))
            .when(c("dtype") == "fp16").then(c("hw_fp16_tflops"))
            .otherwise(c("hw_bf16_tflops")))


def _algo_factor() -> pl.Expr:
    """Bytes through each rank's link per buffer byte (the nccl-tests bus-bandwidth factors of a ring)."""
    n = c("world_size").cast(pl.Float64)
    return (pl.when(c("op") == "all_reduce").then(2.0 * (n - 1.0) / n)
            .when(c("op").is_in(["all_gather", "reduce_scatter", "all_to_all"])).then((n - 1.0) / n)
            .otherwise(1.0))


# A collective's per-message latency (the alpha of alpha-beta), from NCCL's own cost model (NVIDIA/nccl 5067397c,
# src/graph/tuning.cc, ncclTopoTuneModel): time = baseLatencies[algo][proto] + steps x hwLatencies[link][algo][proto]
# + bytes / busBw. The latency-bound sizes run the LL protocol (its latencies are the lowest), so alpha uses LL's
# figures: base Ring/LL 6.6 us, Tree/LL 6.8 us (line 151); per hop Ring/LL 0.6 us over NVLink, 1.0 over PCIe, 2.7
# over the network, Tree/LL 0.6 / 1.0 / 5.0 (lines 158-174; unchanged since NCCL 2.19). Ring steps (line 289):
# 2(n-1) for all-reduce, n-1 for all-gather and reduce-scatter, of which 2(nodes-1) (all-reduce) or nodes-1 cross
# the network (line 411); tree all-reduce: 2 x ((ranks per node - 1) intra hops + log2(nodes) network hops) (line
# 416); NCCL runs the faster. all-to-all (grouped send/recv, no tuning.cc entry) is charged the all-gather's n-1
# steps, send/recv and broadcast one hop: our reading, not NCCL's table. vLLM's custom all-reduce is not NCCL: a
# barrier, then every peer's buffer read in parallel (csrc/custom_all_reduce.cuh, cross_device_reduce_1stage, the
# small-message path): 2 hops, no NCCL base.
NCCL_BASE_LATENCY_US = {"ring": 6.6, "tree": 6.8}
NCCL_HOP_LATENCY_US = {"ring": {"nvlink": 0.6, "pcie": 1.0, "net": 2.7},
                       "tree": {"nvlink": 0.6, "pcie": 1.0, "net": 5.0}}
# NCCL's latencies are microseconds of one reference machine; they do not move with the GPU (tuning.cc keys only its
# bandwidth caps on the compute capability: llMaxBws, perChMaxRingLL128Bws, lines 177-196 at 5067397c). Over NVLink
# the small-message path is the GPU's own: LL kernels write 8-byte flag+data words and spin on the peer's (src/device/
# prims_ll.h), so a step costs SM cycles and a slower clock is a longer step. The measured smallest all-reduces say
# so: A100 (1,410 MHz) takes 1.45-1.61x the H100's (1,980 MHz) 6.2-15.6 us at 2-8 GPUs, the clock ratio being 1.40
# (AIConfigurator, 512 B). So the NVLink part of alpha (base + intra-node hops) is read as cycles at
# NCCL_LATENCY_CLOCK_MHZ (Hopper's: the table's current figures came with NCCL 2.19's Hopper tuning) and scaled by
# the GPU's boost clock (GPUSpec.boost_clock_mhz). Over PCIe it is not: each step crosses the host's root complex,
# and the PCIe cards' smallest all-reduces do not follow their clocks (L40S 2,520 MHz 7.7 us, RTX PRO 6000
# 2,617 MHz 6.3 us at 2 GPUs). Network hops are the NIC's and stay as NCCL states them. The Blackwell parts' 1.4x
# over Hopper at the same clock is not explained by any datasheet figure; the trees learn it from their SM count.
NCCL_LATENCY_CLOCK_MHZ = 1980.0


def _cycle_scale(ref_mhz: float) -> pl.Expr:
    """ref_mhz / the GPU's boost clock: a fixed cycle count stated at ref_mhz, in seconds on this GPU (1 where the
    clock is not stated: a user's GPU object, CPU hosts)."""
    clk = c("hw_boost_clock_mhz").cast(pl.Float64).fill_null(0.0)
    return pl.when(clk > 0).then(ref_mhz / clk).otherwise(1.0)


def collective_latency_s(*, clock_scaled: bool = True) -> pl.Expr:
    """Seconds of per-message latency of a collective row (NCCL's alpha; 0 on CPU hosts, whose gloo collectives the
    CPU model learns whole). Needs world_size, ranks_per_node, op, hw_intra_link and hw_boost_clock_mhz
    (with_hardware). clock_scaled: the NVLink part in cycles at the GPU's clock (NCCL_LATENCY_CLOCK_MHZ); off for
    models fitted before it (KernelModel._clock_terms)."""
    n = c("world_size").cast(pl.Float64).fill_null(1.0)
    rpn = pl.min_horizontal(c("ranks_per_node").cast(pl.Float64).fill_null(n), n)
    nodes = (n / rpn).ceil()
    pcie = c("hw_intra_link") == "pcie"
    gpu = pl.when(pcie).then(1.0).otherwise(_cycle_scale(NCCL_LATENCY_CLOCK_MHZ)) if clock_scaled else pl.lit(1.0)

    def hop(algo: str) -> pl.Expr:
        lat = NCCL_HOP_LATENCY_US[algo]
        return pl.when(pcie).then(lat["pcie"]).otherwise(lat["nvlink"]) * gpu

    net = {a: NCCL_HOP_LATENCY_US[a]["net"] for a in NCCL_HOP_LATENCY_US}
    op = c("op")
    steps = (pl.when(op == "all_reduce").then(2.0 * (n - 1.0))
             .when(op.is_in(["all_gather", "reduce_scatter", "all_to_all"])).then(n - 1.0).otherwise(1.0))
    inter = (pl.when(nodes <= 1.0).then(0.0).when(op == "all_reduce").then(2.0 * (nodes - 1.0))
             .when(op.is_in(["all_gather", "reduce_scatter", "all_to_all"])).then(nodes - 1.0).otherwise(1.0))
    inter = pl.min_horizontal(inter, steps)
    ring = NCCL_BASE_LATENCY_US["ring"] * gpu + (steps - inter) * hop("ring") + inter * net["ring"]
    tree = NCCL_BASE_LATENCY_US["tree"] * gpu + 2.0 * ((rpn - 1.0) * hop("tree") + nodes.log(2) * net["tree"])
    nccl = pl.when(op == "all_reduce").then(pl.min_horizontal(ring, tree)).otherwise(ring)
    custom = 2.0 * hop("ring")
    us = (pl.when(c("hw_is_cpu") | (n <= 1.0)).then(0.0)
          .when(op.str.starts_with("custom_all_reduce")).then(custom).otherwise(nccl))
    return us * 1e-6


# A GEMM's fixed cost, in SM cycles: launch, the first tiles' loads filling the pipeline, the epilogue's stores. The
# fastest GEMM of each GPU in AIConfigurator's grid takes 3,600-5,500 cycles at its boost clock (A100 2.5 us = 3,570;
# H100 2.65 us = 5,250; B200 1.86 us = 3,680; L40S 1.74 us = 4,370; RTX PRO 6000 2.1 us = 5,500), whatever its
# FLOPs, so the roofline's third bound is GEMM_LAUNCH_FLOOR_CYCLES / boost clock. In seconds the A100's floor is 1.4x
# the H100's; without it the trees read the A100's small GEMMs (roofline 0.3-1 us at 312 TFLOPS) as the newer parts'
# and predicted them up to 2x fast (32 % MAPE leave-one-GPU-out, 23 % with the floor).
GEMM_LAUNCH_FLOOR_CYCLES = 5000.0


def roofline(df: pl.DataFrame, *, collective_latency: bool = True, clock_terms: bool = True) -> pl.DataFrame:
    """Adds `roof_s` (datasheet lower bound on time) and the shape features every family uses. A collective's
    bound is alpha + bytes / link (collective_latency_s); collective_latency=False keeps the bandwidth term alone,
    for kernel models fitted before the latency term existed (KernelModel.prepare decides). clock_terms: the fixed
    costs counted in cycles at the GPU's boost clock (a GEMM's launch floor, NCCL's NVLink latency); off for models
    fitted before them."""
    df = with_hardware(df)
    dbytes = c("dtype").replace_strict(DTYPE_BYTES, default=2, return_dtype=pl.Float64)
    m, n, k = (c(x).cast(pl.Float64) for x in ("m", "n", "k"))
    gemm_flops = 2.0 * m * n * k
    gemm_bytes = dbytes * (m * k + k * n + m * n)
    b, a, kv, s, hd = (c(x).cast(pl.Float64) for x in ("batch", "heads", "kv_heads", "seq_len", "head_dim"))
    # QK^T and AV: 4*b*a*s^2*hd FLOPs forward, half of it under a causal mask. Some published attention rows
    # (Azure's) are non-causal, so the mask is a probe column; our composition always asks for causal.
    causal = c("causal").fill_null(True) if "causal" in df.columns else pl.lit(True)
    attn_fwd = pl.when(causal).then(2.0).otherwise(4.0) * b * a * s * s * hd
    attn_flops = pl.when(c("pass_") == "fwd").then(attn_fwd).otherwise(3.5 * attn_fwd)
    attn_bytes = dbytes * b * s * hd * (2.0 * a + 2.0 * kv) * pl.when(c("pass_") == "fwd").then(1.0).otherwise(2.5)
    # Decode attention: one query token per sequence reads the whole KV cache (K and V) once; 4*b*a*s*hd FLOPs.
    dec_flops = 4.0 * b * a * s * hd
    dec_bytes = dbytes * b * kv * hd * (2.0 * s + 2.0) + 2.0 * b * a * hd * 2.0
    moe_flops, moe_bytes = _moe_work(df, dbytes)
    traffic = c("op").replace_strict(MEMBOUND_TRAFFIC, default=2.0, return_dtype=pl.Float64)
    mem_bytes = pl.coalesce(c("bytes").cast(pl.Float64), c("numel").cast(pl.Float64) * dbytes * traffic)
    peak = _peak_tflops() * 1e12
    hbm = c("hw_hbm_tb_per_s") * 1e12
    cross = c("ranks_per_node").fill_null(c("world_size")) < c("world_size")
    # The link a collective crosses: the cluster's own figure when the query carries one (a user's override of
    # intra-/inter-node bandwidth), the catalog's datasheet figure otherwise (probes measured on that hardware).
    catalog_link = pl.when(cross).then(c("hw_inter_gb_per_s")).otherwise(c("hw_intra_gb_per_s"))
    link_col = c("link_gb_per_s").cast(pl.Float64) if "link_gb_per_s" in df.columns else pl.lit(None, pl.Float64)
    link = pl.coalesce(link_col, catalog_link) * 1e9
    coll_bytes = c("bytes").cast(pl.Float64) * _algo_factor()
    fam = c("family")
    flops = (pl.when(fam == "gemm").then(gemm_flops).when(fam == "attention").then(attn_flops)
             .when(fam == "decode_attention").then(dec_flops).when(fam == "moe").then(moe_flops).otherwise(0.0))
    moved = (pl.when(fam == "gemm").then(gemm_bytes).when(fam == "attention").then(attn_bytes)
             .when(fam == "decode_attention").then(dec_bytes).when(fam == "moe").then(moe_bytes)
             .when(fam == "membound").then(mem_bytes).otherwise(coll_bytes))
    alpha = collective_latency_s(clock_scaled=clock_terms) if collective_latency else pl.lit(0.0)
    clk = c("hw_boost_clock_mhz").cast(pl.Float64).fill_null(0.0)
    floor = (pl.when((fam == "gemm") & (clk > 0) & ~c("hw_is_cpu")).then(GEMM_LAUNCH_FLOOR_CYCLES / (clk * 1e6))
             .otherwise(0.0)) if clock_terms else pl.lit(0.0)
    roof = (pl.when(fam == "collective").then(alpha + moved / link)
            .otherwise(pl.max_horizontal(flops / peak, moved / hbm, floor)))
    return df.with_columns(k_flops=flops, k_bytes=moved, k_cross_node=cross,
                           k_latency_s=pl.when(fam == "collective").then(alpha).otherwise(0.0)).with_columns(
        roof_s=pl.max_horizontal(roof, pl.lit(1e-9)))


# GPU attention backward from the measured forward: FlashAttention-2's backward computes 2.5x the forward's matmul
# FLOPs (five GEMMs per tile to the forward's two; Dao 2023, FlashAttention-2, section 3.2), so fwd+bwd = 3.5x the
# forward at the forward's efficiency. A stated ratio, used only where no GPU backward probe trained the model.
ATTN_BACKWARD_RATIO = {"fwd_bwd": 3.5, "bwd": 2.5}

# A fused MoE layer's shape (AIConfigurator's moe table names): tokens, hidden, expert FFN width, experts per token,
# experts, and the moe_tp x moe_ep split of one GPU's share.
MOE_COLUMNS = ("num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size")


def _moe_work(df: pl.DataFrame, dbytes: pl.Expr) -> tuple[pl.Expr, pl.Expr]:
    """(FLOPs, bytes) of one GPU's share of a gated MoE layer: gate, up and down GEMMs of tokens x topk / ep routed
    rows at inter / tp width, and the weights of the local experts those tokens touch (expected distinct experts
    under uniform routing: E_local x (1 - (1 - 1/E)^(tokens x topk)))."""
    if not set(MOE_COLUMNS) <= set(df.columns):
        return pl.lit(0.0), pl.lit(0.0)
    t, h, i, k, e, tp, ep = (c(x).cast(pl.Float64) for x in MOE_COLUMNS)
    flops = 6.0 * h * (i / tp) * t * k / ep
    touched = (e / ep) * (1.0 - (1.0 - 1.0 / e).pow(t * k))
    weights = touched * 3.0 * h * (i / tp) * dbytes
    acts = 2.0 * t * h * 2.0 + 3.0 * t * k / ep * (i / tp) * 2.0
    return flops, weights + acts


ATTN_IMPLS = ("flash2", "flash3", "cudnn", "efficient", "math", "sdpa-cpu", "flash4", "trtllm", "flashinfer", "triton")
# A collective's efficiency is learned against its bandwidth roofline from features that do not contain the link
# rate itself: the predicted time then scales exactly with 1/bandwidth, so a user's faster link is never slower
# (a tree given log(link) or log(roof) learned to cancel them, and predicted TP-8 faster at 8 GB/s than at 300).
COLLECTIVE_FEATURES = ("f_log_bytes", "f_world", "f_cross", "f_is_cpu", "f_op", "f_log_sms", "f_rpn")


# GPU families leave out f_balance (peak / memory bandwidth at the row's dtype): fp8 rows of a GPU then sit in the
# same hardware coordinates as its bf16 rows. With it, a held-out H200's fp8 GEMMs (balance below every fp8 row in
# training) were read as bf16 ones and predicted 1.6x too fast (37 % MAPE leave-one-GPU-out, 13 % without it; B200
# and H100 no worse). Bundles saved with it keep it: the saved names choose the columns (kernel_features(names=)).
GPU_DROPPED = ("f_rpn", "f_balance")
GPU_FAMILIES_NEW_FEATURES = ("gemm", "attention", "decode_attention", "moe")
# Where a row sits against its GPU's ridge point: log10(arithmetic intensity / (peak / memory bandwidth)) at the
# row's dtype. Dimensionless, so it carries between GPUs where the balance alone does not: the A100's balance (153
# FLOP/B) lies below every other GPU's bf16 balance (281-419), so trees given f_intensity and the GPU's rates had
# to extrapolate, and its GEMMs near the ridge, 1.5-2x slower than either bound, were predicted from compute-bound
# rows of the others. GEMM leave-one-GPU-out, A100: 23 -> 20 % (with the launch floor). Fed to the families in
# RIDGE_FAMILIES only; a saved model's own names choose its columns.
RIDGE_FAMILIES = ("gemm",)


def kernel_features(df: pl.DataFrame, family: str | None = None, names: list[str] | None = None) -> pl.DataFrame:
    """Numeric features for one family's rows (after roofline): the named columns (a saved model's), or the
    family's default list."""
    fam = family.removesuffix(".cpu") if family is not None else None
    pool = _all_features(df)
    if fam == "moe":
        pool = pl.concat([pool, _moe_features(df)], how="horizontal")
    if names is not None:
        missing = [n for n in names if n not in pool.columns]
        if missing:
            from perfpredict.core.errors import PerfPredictError

            raise PerfPredictError(f"the {family} kernel model was trained on features {missing} this code does not "
                                   "build; retrain with `perfpredict train`")
        return pool.select(names)
    if fam == "collective":
        return pool.select(COLLECTIVE_FEATURES)
    if family in GPU_FAMILIES_NEW_FEATURES:  # GPU models only: the CPU ones (family.cpu) keep their list
        return pool.drop(GPU_DROPPED + (() if family in RIDGE_FAMILIES else ("f_ridge",)))
    return pool.drop("f_rpn", "f_ridge")


def _moe_features(df: pl.DataFrame) -> pl.DataFrame:
    cols = {x: (c(x).cast(pl.Float64) if x in df.columns else pl.lit(None, pl.Float64)) for x in MOE_COLUMNS}
    log = lambda e: (e.fill_null(0.0) + 1.0).log10()  # noqa: E731
    return df.select(
        f_moe_log_tokens=log(cols["num_tokens"]), f_moe_log_hidden=log(cols["hidden_size"]),
        f_moe_log_inter=log(cols["inter_size"]), f_moe_topk=cols["topk"].fill_null(0.0),
        f_moe_log_experts=log(cols["num_experts"]), f_moe_tp=cols["moe_tp_size"].fill_null(1.0),
        f_moe_ep=cols["moe_ep_size"].fill_null(1.0),
        # routed rows per local expert: below ~16 the grouped GEMM is weight-bound, above it compute-bound
        f_moe_log_rows_per_expert=log(cols["num_tokens"] * cols["topk"] / cols["num_experts"]),
        f_moe_skewed=(c("distribution") != "balanced").cast(pl.Float64).fill_null(0.0)
        if "distribution" in df.columns else pl.lit(0.0))


def _all_features(df: pl.DataFrame) -> pl.DataFrame:
    log = lambda e: (e.cast(pl.Float64).fill_null(0.0) + 1.0).log10()  # noqa: E731
    peak = _peak_tflops()
    causal = c("causal").fill_null(True) if "causal" in df.columns else pl.lit(True)
    impl = c("attn_impl") if "attn_impl" in df.columns else pl.lit(None, pl.Utf8)
    return df.select(
        f_log_roof=c("roof_s").log10(),
        f_log_flops=log(c("k_flops")),
        f_log_bytes=log(c("k_bytes")),
        f_intensity=log(c("k_flops") / (c("k_bytes") + 1.0)),
        f_balance=(peak * 1e12 / (c("hw_hbm_tb_per_s") * 1e12)).log10(),
        f_ridge=(c("k_flops") / (c("k_bytes") + 1.0) / (peak / c("hw_hbm_tb_per_s"))).log10(),
        f_log_peak=peak.log10(),
        f_log_hbm=c("hw_hbm_tb_per_s").log10(),
        f_log_m=log(c("m")), f_log_n=log(c("n")), f_log_k=log(c("k")),
        f_log_batch=log(c("batch")), f_heads=c("heads").cast(pl.Float64).fill_null(0.0),
        f_gqa=(c("heads").cast(pl.Float64) / c("kv_heads")).fill_null(1.0),
        f_log_seq=log(c("seq_len")), f_head_dim=c("head_dim").cast(pl.Float64).fill_null(0.0),
        f_log_numel=log(c("numel")),
        f_world=c("world_size").cast(pl.Float64).fill_null(1.0),
        f_cross=c("k_cross_node").cast(pl.Float64).fill_null(0.0),
        f_log_link=(pl.when(c("k_cross_node")).then(c("hw_inter_gb_per_s")).otherwise(c("hw_intra_gb_per_s"))).log10(),
        f_is_cpu=c("hw_is_cpu").cast(pl.Float64),
        f_dtype=c("dtype").replace_strict(DTYPE_BYTES, default=2, return_dtype=pl.Float64),
        f_pass=c("pass_").replace_strict({p: i for i, p in enumerate(PASSES)}, default=0, return_dtype=pl.Float64),
        f_op=c("op").replace_strict({o: i for i, o in enumerate(MEMBOUND_OPS + COLLECTIVES)}, default=-1,
                                    return_dtype=pl.Float64),
        f_log_sms=log(c("hw_sms")),
        f_causal=causal.cast(pl.Float64),
        f_impl=impl.replace_strict({m: float(i) for i, m in enumerate(ATTN_IMPLS)}, default=-1.0,
                                   return_dtype=pl.Float64),
        f_rpn=c("ranks_per_node").cast(pl.Float64).fill_null(c("world_size").cast(pl.Float64)).fill_null(1.0),
    )


MEMO_ROWS = 100_000  # distinct kernel queries KernelModel.predict_remembered keeps (a large ranking asks ~1,000)
XGB_PARAMS = dict(n_estimators=300, max_depth=6, learning_rate=0.06, subsample=0.9, colsample_bytree=0.9,
                  min_child_weight=2.0, reg_lambda=1.0, tree_method="hist", n_jobs=2)


class KernelModel:
    """One xgboost regressor per family on log10(time / roofline). scikit-learn contract."""

    def __init__(self, *, seed: int = 0, params: dict | None = None):
        self.seed = seed
        self.params = params

    def prepare(self, probes: pl.DataFrame) -> pl.DataFrame:
        if "family" not in probes.columns:
            probes = probes.with_columns(family=c("op").map_elements(family_of, return_dtype=pl.Utf8))
        return roofline(self._backward_from_forward(probes), collective_latency=self._collective_latency(),
                        clock_terms=self._clock_terms())

    def _collective_latency(self) -> bool:
        """Whether collective rooflines carry NCCL's per-message latency: yes for a model being fitted now (fit
        records it per collective family), no for a saved model whose record lacks it (its trees learned their
        efficiency against the bandwidth-only bound, and keep predicting as they did)."""
        fams = getattr(self, "families_", None)
        if not fams:
            return True
        coll = [v for k, v in fams.items() if k.removesuffix(".cpu") == "collective"]
        return all(v.get("collective_latency", False) for v in coll) if coll else True

    def _clock_terms(self) -> bool:
        """Whether rooflines carry the fixed costs counted in cycles (GEMM launch floor, clock-scaled NCCL latency):
        yes for a model being fitted now, no for a saved model whose record lacks `clock_terms` (its trees learned
        against the rooflines without them)."""
        fams = getattr(self, "families_", None)
        if not fams:
            return True
        return all(v.get("clock_terms", False) for v in fams.values())

    def _backward_from_forward(self, probes: pl.DataFrame) -> pl.DataFrame:
        """GPU attention backward as the predicted forward times ATTN_BACKWARD_RATIO, where the GPU attention model
        saw forward probes only (every GPU source so far: AIConfigurator, Azure). Such a model has never seen a
        backward row, so its trees would read a fwd_bwd query as a forward of 3.5x the FLOPs at another
        efficiency (3.2x the forward in a test, not 3.5x). `k_pass_ratio` carries the factor to predict_prepared.
        Models fitted on GPU backward probes (our own, once collected) learn it; saved bundles without the record
        of their passes keep their behaviour."""
        passes = (getattr(self, "families_", None) or {}).get("attention", {}).get("passes")
        if passes != ["fwd"] or "pass_" not in probes.columns:
            return probes.with_columns(k_pass_ratio=pl.lit(1.0))
        from perfpredict.models.hardware_frame import hardware_table

        cpus = hardware_table().filter(c("hw_is_cpu"))["hardware"].to_list()
        swap = ((c("family") == "attention") & c("pass_").is_in(list(ATTN_BACKWARD_RATIO))
                & ~c("hardware").is_in(cpus))
        return probes.with_columns(
            k_pass_ratio=pl.when(swap).then(c("pass_").replace_strict(ATTN_BACKWARD_RATIO, default=1.0,
                                                                      return_dtype=pl.Float64)).otherwise(1.0),
            pass_=pl.when(swap).then(pl.lit("fwd")).otherwise(c("pass_")))

    @staticmethod
    def _keys(df: pl.DataFrame) -> np.ndarray:
        """Model key per row: the family, with CPUs apart. CPU kernels behave nothing like GPU ones, and mixing
        them cost GPU extrapolation dearly (held-out A100 GEMMs: 31% median error with CPU probes in the
        training set, 7.5% without)."""
        fam = df["family"].to_numpy().astype(object)
        cpu = df["hw_is_cpu"].to_numpy().astype(bool)
        return np.where(cpu, fam + ".cpu", fam)

    def fit(self, probes: pl.DataFrame) -> KernelModel:
        self.__dict__.pop("_memo", None)  # predict_remembered's answers were the old models'
        self.models_ = {}
        self.feature_names_ = {}
        self.families_ = {}
        df = self._training_rows(probes)
        keys = self._keys(df)
        for key in sorted(set(keys)):
            self._fit_key(key, df.filter(pl.Series(keys == key)))
        return self

    def without(self, probes: pl.DataFrame, hardware: str) -> KernelModel:
        """The model `fit(probes without hardware's rows)` returns, where `self` was fitted on `probes`: only the
        families that saw that hardware are refitted, the others are shared. Each family's regressor depends on its
        own rows and the seed alone, so this is the same model, bit for bit (tested). Training holds each measured
        hardware out in turn (fit.unseen_hardware_residuals) and evaluate's hardware split does it again per fold:
        with AIConfigurator's ~200k GPU probes in, refitting every family for a held-out CPU host re-ran every GPU
        fit unchanged (16 of training's 29 s, most of the hardware split)."""
        out = KernelModel(seed=self.seed, params=self.params)
        out.models_, out.feature_names_, out.families_ = {}, {}, {}
        df = out._training_rows(probes.filter(c("hardware") != hardware))  # out's empty families_: no swap
        keys = self._keys(df)
        for key in sorted(set(keys)):
            sub = df.filter(pl.Series(keys == key))
            seen = self.families_.get(key)
            # The row count guards the contract: a family refitted from other probes than self's is refitted.
            if (seen is not None and hardware not in seen["hardware"] and seen["rows"] == sub.height
                    and key in self.models_):
                out.models_[key], out.feature_names_[key] = self.models_[key], self.feature_names_[key]
                out.families_[key] = seen
            else:
                out._fit_key(key, sub)
        return out

    def _training_rows(self, probes: pl.DataFrame) -> pl.DataFrame:
        # Called before families_ is filled, so prepare() does not swap attention backward rows (a model in fitting
        # learns from the passes it is given).
        # The trl family's probes time whole TRL ops against these models (models.trl_scales); none learns from them.
        probes = probes.filter(~c("op").is_in(list(TRL_OPS)))
        return self.prepare(probes.filter((c("outcome").fill_null("ok") == "ok") & (c("time_s") > 0)))

    def _fit_key(self, key: str, sub: pl.DataFrame) -> None:
        if sub.height < 5:
            return
        X = kernel_features(sub, key).to_numpy()
        self.feature_names_[key] = kernel_features(sub.head(1), key).columns
        y = np.log10(sub["time_s"].to_numpy() / sub["roof_s"].to_numpy())
        self.models_[key] = GBRegressor(seed=self.seed, **(self.params or XGB_PARAMS)).fit(X, y)
        self.families_[key] = {"rows": sub.height, "hardware": sorted(sub["hardware"].unique().to_list()),
                               "passes": sorted(sub["pass_"].drop_nulls().unique().to_list())}
        if key.removesuffix(".cpu") == "collective":
            self.families_[key]["collective_latency"] = True
        self.families_[key]["clock_terms"] = True

    def predict_prepared(self, df: pl.DataFrame) -> np.ndarray:
        """Seconds for rows that already went through prepare(). A CPU family without CPU probes falls back to
        the GPU model of the family; a family without any model gets twice the roofline."""
        out = np.empty(df.height)
        keys = self._keys(df)
        roof = df["roof_s"].to_numpy()
        for key in np.unique(keys):
            idx = keys == key
            name = key if key in self.models_ else key.removesuffix(".cpu")
            model = self.models_.get(name)
            if model is None:
                out[idx] = roof[idx] * 2.0
                continue
            X = kernel_features(df.filter(pl.Series(idx)), name, self.feature_names_.get(name)).to_numpy()
            ratio = 10.0 ** model.predict(X)
            out[idx] = roof[idx] * ratio
        if "k_pass_ratio" in df.columns:
            out *= df["k_pass_ratio"].to_numpy()
        return out

    def predict(self, probes: pl.DataFrame) -> np.ndarray:
        return self.predict_prepared(self.prepare(probes))

    def predict_remembered(self, queries: pl.DataFrame) -> np.ndarray:
        """predict, each query row's seconds remembered by its values: a loaded model never changes, and the
        rankings of one process ask largely the same kernels again (`--gpus auto`, what would fit, the API in a
        server, a warm ranking). A row is predicted alone exactly as in a batch (its features and trees are its
        own). fit forgets; past MEMO_ROWS remembered rows the memo starts again."""
        memo = self.__dict__.setdefault("_memo", {})
        keys = queries.rows()
        new = [i for i, k in enumerate(keys) if k not in memo]
        if new:
            if len(memo) + len(new) > MEMO_ROWS:
                memo.clear()
                new = list(range(len(keys)))
            for i, v in zip(new, self.predict(queries[new]).tolist(), strict=True):
                memo[keys[i]] = v
        return np.array([memo[k] for k in keys], dtype=float)
