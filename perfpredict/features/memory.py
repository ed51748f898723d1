"""Per-rank memory descriptors: model states by ZeRO stage and framework, activations (Korthikanti et al. 2022,
generalised to GQA, gated MLPs and flash attention), full-vocab logits, the reference model.

All functions are polars frame -> frame with the columns added; sizes in bytes. The peak rank is the worse of the
first pipeline stage (most micro-batches in flight, input embedding) and the last (output head and logits)."""

from __future__ import annotations

import polars as pl

from perfpredict.features.compute import (
    compute_bytes,
    hf_trainer,
    no_sync_grad_bytes,
    on_cpu,
    params_on_host,
    runtime_from_zero,
    runtime_is,
    runtime_value,
)

c = pl.col

# Bytes per full-vocabulary logit at the peak of transformers' logits path (the model's head in the compute dtype,
# `logits.float()`, F.cross_entropy; transformers 4.44 LlamaForCausalLM shifts an fp32 `.contiguous()` copy first,
# >= 4.46 ForCausalLMLoss pads the labels instead): the peak is the log-softmax's backward, where three fp32 [N, V]
# tensors are alive, the output log_softmax saved for it, nll_loss's gradient (a zeros_like of it, scattered) and
# the gradient it returns; the 16-bit logits and the fp32 copy are gone by then (nothing saves them). Replayed on
# CPU under torch.profiler's allocation events (collect.harness.run_step.profiled_peak_bytes; tests/test_optim_softcap
# .py): 11.98 B per logit on the 4.44 path, 12.00 on the >= 4.46 one, at N 512, V 32,000. The collect harness's
# log_softmax + gather (collect/harness/objectives.py:110) has the same three. Earlier rows were composed with 10.
HF_LOGIT_BYTES = 12.0


def _tp():
    return c("p_tp").cast(pl.Float64)


def plan_defaults(df: pl.DataFrame) -> pl.DataFrame:
    """Plan, workload and model columns newer than some datasets (expert parallelism, parameter offload, uneven
    stages, the optimizer, soft-capped logits): added with the value those rows ran with where a frame lacks them or
    holds nulls."""
    from perfpredict.core.frameworks import RUNTIME
    from perfpredict.core.scenario import LATER_COLUMN_DEFAULTS, PLAN_COLUMN_DEFAULTS

    dtypes = {"p_ep": pl.Int64, "p_param_offload": pl.Boolean, "p_stage_layers": pl.Utf8, "p_fused_head": pl.Boolean,
              "p_eager_attention": pl.Boolean, "p_reentrant_checkpoint": pl.Boolean, "w_optimizer": pl.Utf8,
              "m_logit_softcap": pl.Float64, "w_seq_len_cv": pl.Float64, "w_peak_seq_len": pl.Int64}
    df = df.with_columns([
        (c(k).cast(dtypes[k]).fill_null(v) if k in df.columns else pl.lit(v, dtype=dtypes[k])).alias(k)
        for k, v in {**PLAN_COLUMN_DEFAULTS, **LATER_COLUMN_DEFAULTS}.items()])
    # The runtime whose memory/communication rules apply (core.frameworks RUNTIME: trl+deepspeed -> deepspeed ...).
    return df.with_columns(d_runtime=c("p_framework").replace_strict(RUNTIME, default=c("p_framework"),
                                                                     return_dtype=pl.Utf8))


def memory_seq_len() -> pl.Expr:
    """The sequence length the peak memory is composed at: the longest micro-batch's padded length where batches are
    padded to their longest sample (Workload.peak_seq_len), else seq_len. A padded batch's activations and logits
    grow with its own length, and the peak is the step whose batch is longest, not the mean one the step time
    follows: e.g. Liger's FSDP example rows log allocated peaks per step that move in steps of one 16-token padding
    multiple (datasets/public/liger_hf_examples/SOURCE.md)."""
    return pl.max_horizontal(c("w_seq_len"), c("w_peak_seq_len").fill_null(0)).cast(pl.Float64)


def optimizer_rule(field: str) -> pl.Expr:
    """Per row, the workload optimizer's `field` in core.frameworks OPTIMIZERS; null where the table leaves it to the
    runtime (None) or the workload names none."""
    from perfpredict.core.frameworks import OPTIMIZERS

    values = {n: getattr(o, field) for n, o in OPTIMIZERS.items() if getattr(o, field) is not None}
    dtype = pl.Boolean if all(isinstance(v, bool) for v in values.values()) else pl.Float64
    return c("w_optimizer").replace_strict(values, default=None, return_dtype=dtype)


def stage_layout(df: pl.DataFrame) -> pl.DataFrame:
    """Layers on the first, the last and the fullest pipeline stage, and how many micro-batches the fullest
    middle stage keeps in flight. Even splits: layers/pp everywhere; uneven ones (p_stage_layers) as the
    framework places them: the embedding on the first stage, the head and loss on the last."""
    even = c("m_layers").cast(pl.Float64) / c("p_pp")
    parts = c("p_stage_layers").str.split(",").list.eval(pl.element().cast(pl.Int64, strict=False))
    uneven = c("p_stage_layers") != ""
    # No split given: the runtime's own. nanotron balances its pipeline blocks by compute cost, head included
    # (core.frameworks.nanotron_stage_layers), so its first stages hold more layers than layers/pp.
    own = runtime_is(lambda r: r.cost_balanced_stages) & ~uneven & (c("p_pp") > 1)
    df = df.with_columns(_own_split=own)
    df = df.with_columns(_split=_cost_split(df))
    parts = pl.when(c("_own_split")).then(c("_split")).otherwise(parts)
    uneven = uneven | c("_own_split")
    return df.with_columns(
        d_layers_first=pl.when(uneven).then(parts.list.first().cast(pl.Float64)).otherwise(even),
        d_layers_last=pl.when(uneven).then(parts.list.last().cast(pl.Float64)).otherwise(even),
        d_layers_max=pl.when(uneven).then(parts.list.max().cast(pl.Float64)).otherwise(even),
    ).drop("_own_split", "_split")


def _cost_split(df: pl.DataFrame) -> pl.Series:
    """core.frameworks.nanotron_stage_layers for each row flagged _own_split (null elsewhere, where stage_layout
    does not read it), computed once per distinct shape. Only the flagged rows are read: a ranking's thousands of
    other plans (every DPO ranking: nanotron runs no DPO) cost no Python loop."""
    from perfpredict.core.frameworks import nanotron_stage_layers

    flagged = df["_own_split"].fill_null(False).arg_true().to_list()
    out: list[list[int] | None] = [None] * df.height
    if not flagged:
        return pl.Series("_split", out, dtype=pl.List(pl.Int64))
    keys = ("m_layers", "p_pp", "m_hidden", "m_heads", "m_head_dim", "m_ffn", "m_vocab")
    memo: dict[tuple, list[int]] = {}
    for i, k in zip(flagged, df[flagged].select(*keys).iter_rows(), strict=True):
        if k not in memo:
            layers, pp, h, heads, hd, ffn, vocab = (int(x or 0) for x in k)
            width = heads * hd if heads and hd else h  # a row without a head_dim: attention as wide as the model
            memo[k] = list(nanotron_stage_layers(layers, pp, hidden=h, attn_width=width, ffn=ffn, vocab=vocab))
        out[i] = memo[k]
    return pl.Series("_split", out, dtype=pl.List(pl.Int64))


def expert_parallel(df: pl.DataFrame) -> pl.DataFrame:
    """Expert weights per layer and how many of them one rank holds: expert parallelism shards the experts over
    ep ranks (each holds experts/ep whole experts), carved out of data parallelism."""
    mats = pl.when(c("m_gated")).then(3.0).otherwise(2.0)
    expert = pl.when(c("m_experts") > 0).then(
        c("m_experts").cast(pl.Float64) * mats * c("m_hidden") * c("m_expert_ffn")).otherwise(0.0)
    return df.with_columns(d_expert_params_layer=expert,
                           d_expert_params_layer_rank=expert / c("p_ep").cast(pl.Float64) / _tp())


def param_shard(df: pl.DataFrame) -> pl.DataFrame:
    """Parameters held by the first and the last pipeline stage of one TP rank (before ZeRO sharding).

    Megatron shards the embedding and the head over TP (vocab-parallel); with tied embeddings and pp>1 both the
    first and the last stage hold a copy."""
    emb = c("m_vocab").cast(pl.Float64) * c("m_hidden") / _tp()
    # Expert parallelism: a rank holds experts/ep of each layer's experts.
    layer = c("m_layer_params") / _tp() - c("d_expert_params_layer") / _tp() + c("d_expert_params_layer_rank")
    body_first, body_last, body_mid = (c(k) * layer for k in ("d_layers_first", "d_layers_last", "d_layers_max"))
    single = body_first + emb * pl.when(c("m_tied")).then(1.0).otherwise(2.0) + c("m_hidden")
    return df.with_columns(
        d_params_first=pl.when(c("p_pp") == 1).then(single).otherwise(body_first + emb),
        d_params_last=pl.when(c("p_pp") == 1).then(single).otherwise(body_last + emb + c("m_hidden")),
        d_params_mid=body_mid,
    ).with_columns(d_params_rank=pl.max_horizontal("d_params_first", "d_params_last", "d_params_mid"))


def state_bytes_per_param(df: pl.DataFrame) -> pl.DataFrame:
    """Bytes per parameter of weights, gradients and optimizer (master copy + Adam moments), and the share of each
    that ZeRO shards over dp.

    - megatron / nanotron: bf16 weights (2), fp32 main grads (4, gradient accumulation in fp32), fp32 master+m+v (12);
      the distributed optimizer (ZeRO-1) shards the 12: 6 + 12/d bytes per parameter, as Megatron's docs state.
    - deepspeed: bf16 weights (2) and grads (2), fp32 master+m+v (12): ZeRO-1 shards 12, -2 also the grads,
      -3 everything (the ZeRO paper's 2+2+K with K=12).
    - fsdp (FSDP2 mixed precision): fp32 sharded parameters double as master (4), fp32 sharded grads (4), m+v (8),
      all sharded; the bf16 unsharded copy is a transient (see fsdp_gathered).
    - ddp (TRL on plain accelerate): torch AdamW on the parameters as loaded: fp32 parameters under autocast
      (w_master_fp32) hold 4 + 4 + 8; a bf16-loaded model trained in bf16 holds 2 + 2 and bf16 m+v (4).
    fp32 training: weights 4, grads 4, m+v 8, no master copy."""
    fp32 = c("w_precision") == "fp32"
    as_loaded = runtime_is(lambda r: r.params_as_loaded)
    ddp16 = as_loaded & ~c("w_master_fp32") & ~fp32
    w = pl.when(fp32).then(4.0).when(runtime_is(lambda r: r.weights_fp32)).then(4.0).when(as_loaded).then(
        pl.when(ddp16).then(2.0).otherwise(4.0)).otherwise(2.0)
    # DeepSpeed's ZeRO optimizers clone their partition into a separate fp32 master tensor even when the model is fp32
    # (deepspeed 0.19.8 runtime/zero/stage_1_and_2.py:560-561 `weights_partition = ...detach().clone().to(dtype=
    # self.master_weights_and_grads_dtype)`; stage3.py:1160/1172 `converted.clone().detach()`); stage 0 hands the
    # torch optimizer the parameters themselves. Measured (collect trl, fp32): 16 B/param at ZeRO-1/2 world 1 with
    # no gradients alive (4 weights + 4 master + 8 Adam), 4 + 12/2 at world 2.
    ds_fp32_master = runtime_from_zero("master_clone_from_zero") & fp32
    no_master = runtime_is(lambda r: not r.separate_master)
    master = pl.when(ds_fp32_master).then(4.0).when(fp32 | no_master | ~c("w_master_fp32")).then(
        0.0).otherwise(4.0)
    # Adam's two moments: the parameters' dtype rule above unless the workload names an optimizer that keeps them
    # otherwise (core.frameworks OPTIMIZERS: bitsandbytes' 8-bit states, ~1 B each); paged states live outside the
    # allocator (Optimizer.paged), so none of them count on the GPU.
    moment = optimizer_rule("moment_bytes").fill_null(pl.when(ddp16).then(2.0).otherwise(4.0))
    paged = optimizer_rule("paged").fill_null(False)
    # The rules above as columns, each evaluated once: the expressions below read them several times over, and an
    # eager with_columns evaluates a repeated expression each time it appears (no common-subexpression pass), which
    # was most of this function's time in a ranking (the same numbers).
    df = df.with_columns(_w=w, _master=master, _moment=moment, _paged=paged, _poff=params_on_host())
    w, master, moment, paged = c("_w"), c("_master"), c("_moment"), c("_paged")
    g = pl.when(fp32 | runtime_is(lambda r: r.grads_fp32)).then(4.0).when(as_loaded).then(w).otherwise(2.0)
    o = master + pl.when(paged).then(0.0).otherwise(2.0 * moment)
    df = df.with_columns(_g=g, _o=o)
    g, o = c("_g"), c("_o")
    z = c("p_zero")
    # Context-parallel ranks hold the same weights and join the gradient reduction: Megatron's distributed
    # optimizer shards over the data-parallel-with-context-parallel group, dp x cp.
    d = (c("p_dp") * c("p_cp")).cast(pl.Float64)
    w_sh = pl.when(z >= 3).then(w / d).otherwise(w)
    g_sh = pl.when(z >= 2).then(g / d).otherwise(g)
    o_sh = pl.when(z >= 1).then(o / d).otherwise(o)
    o_gpu = pl.when(c("p_offload")).then(0.0).otherwise(o_sh)
    # ZeRO-3 offload_param (ZeRO-Infinity) and FSDP's CPUOffload: parameters and their gradient partitions live in
    # host memory; the GPU holds only what is gathered for the layer at work (d_gathered_bytes).
    poff = c("_poff")
    w_gpu = pl.when(poff).then(0.0).otherwise(w_sh)
    g_gpu = pl.when(poff).then(0.0).otherwise(g_sh)
    # Expert weights shard over the expert-data-parallel group, d/ep ranks, not d: a rank's ZeRO shard of its
    # experts is as large as without expert parallelism.
    de = pl.max_horizontal(d / c("p_ep").cast(pl.Float64), pl.lit(1.0))
    we = pl.when(poff).then(0.0).when(z >= 3).then(w / de).otherwise(w)
    ge = pl.when(poff).then(0.0).when(z >= 2).then(g / de).otherwise(g)
    oe = pl.when(c("p_offload")).then(0.0).when(z >= 1).then(o / de).otherwise(o)
    return df.with_columns(d_weight_bpp=w_gpu, d_grad_bpp=g_gpu, d_optim_bpp=o_gpu,
                           d_expert_state_bpp_extra=(we + ge + oe) - (w_gpu + g_gpu + o_gpu),
                           d_state_bpp_unsharded=w + g + o, d_optim_bpp_unsharded=o,
                           # what the optimizer step sees: every gradient of the shard (features.trl may lower
                           # d_grad_bpp where gradients and activations are not alive together) and the Adam
                           # moments' dtype (bf16 moments for a bf16-loaded model on plain torch)
                           d_grad_bpp_step=g_gpu, d_moment_bytes=moment
                           ).drop("_w", "_master", "_moment", "_paged", "_poff", "_g", "_o")


def activation_coefficients(df: pl.DataFrame) -> pl.DataFrame:
    """Per-layer activation bytes per (sequence x token x hidden), split into the part TP replicates unless
    sequence parallelism is on, the part TP shards, and the attention-score part (bytes per a*s^2*b).

    Korthikanti et al. 2022 (Table 2): 34 sbh + 5 a s^2 b with 10 sbh replicated under TP without SP, for
    MHA, a 4h GELU MLP and dropout. Here: no dropout (none of the preference trainers use it), GQA K/V at
    kv_heads/heads, SwiGLU keeps gate, up and silu(gate) and the product, and flash attention stores no scores."""
    from perfpredict.features.trl import HF_REPLICATED_COEF, is_trl

    # TRL's rows run transformers' Llama (features.trl): three tensors kept per norm, K/V repeated to all heads.
    hf = is_trl()
    r_kv = pl.when(hf).then(1.0).otherwise(c("m_kv_heads").cast(pl.Float64) / c("m_heads"))
    attn_width = c("m_heads").cast(pl.Float64) * c("m_head_dim") / c("m_hidden")
    f = pl.when(c("m_experts") > 0).then(c("m_expert_ffn") * c("m_experts_per_token")).otherwise(c("m_ffn"))
    f_h = f.cast(pl.Float64) / c("m_hidden")
    # two norm inputs (4) + QKV input (2) + MLP input (2)
    replicated = pl.when(hf).then(HF_REPLICATED_COEF).otherwise(8.0)
    attn = 2.0 * attn_width + 4.0 * r_kv * attn_width + 2.0 * attn_width  # Q, K, V, attention output
    mlp = pl.when(c("m_gated")).then(8.0 * f_h).otherwise(4.0 * f_h)
    return df.with_columns(d_act_repl_coef=replicated, d_act_shard_coef=attn + mlp, d_act_score_coef=pl.lit(0.0))


def korthikanti_per_layer_bytes(s: float, b: float, h: float, a: float, t: int, sp: bool, recompute: str) -> float:
    """The paper's own formula (Table 2), kept as the reference the generalised version is tested against."""
    if recompute == "full":
        return 2.0 * s * b * h / (t if sp else 1)
    score = 0.0 if recompute == "selective" else 5.0 * a * s / h
    if sp:
        return s * b * h * (34.0 / t + score / t)
    return s * b * h * (10.0 + 24.0 / t + score / t)


def activations(df: pl.DataFrame) -> pl.DataFrame:
    """Activation bytes of the first stage (most micro-batches in flight) per rank, and the logits on the last."""
    act_bytes = compute_bytes() / 2.0  # coefficients assume 16-bit
    s = memory_seq_len() / c("p_cp")
    b = c("p_micro_batch").cast(pl.Float64) * c("w_seqs_per_sample")
    h = c("m_hidden").cast(pl.Float64)
    sbh = s * b * h * act_bytes
    t = _tp()
    repl = pl.when(c("p_sp")).then(c("d_act_repl_coef") / t).otherwise(c("d_act_repl_coef"))
    # transformers' eager attention (plan eager_attention) keeps each layer's scores for its backward: softmax saves
    # its fp32 output (4 B per score) and the second matmul the 16-bit cast of it (2 B; core.frameworks
    # EAGER_ATTENTION), [b, heads/tp, s/cp, s] per layer; the fused kernels keep none.
    a = c("m_heads").cast(pl.Float64)
    eager_scores = pl.when(c("p_eager_attention").fill_null(False)).then(
        6.0 * b * a / t * s * memory_seq_len()).otherwise(0.0)
    # A layer's activations as columns, each evaluated once (the outputs below read them several times; an eager
    # with_columns evaluates a repeated expression each time it appears: the same numbers, a third of the time).
    df = df.with_columns(_sbh=sbh).with_columns(_full=c("_sbh") * (repl + c("d_act_shard_coef") / t) + eager_scores)
    sbh, full_layer = c("_sbh"), c("_full")
    layer_input = pl.when(c("p_sp")).then(2.0 * sbh / t).otherwise(2.0 * sbh)
    df = df.with_columns(_per_layer=pl.when(c("p_recompute") == "full").then(layer_input).otherwise(full_layer))
    per_layer = c("_per_layer")
    pp = c("p_pp").cast(pl.Float64)
    m = c("p_grad_accum").cast(pl.Float64)
    inflight = (pl.when(c("p_pp") == 1).then(1.0)
                .when(c("p_schedule") == "gpipe").then(m)
                .when(c("p_schedule") == "interleaved")
                .then(pl.min_horizontal(pp, m) * (1.0 + (pp - 1.0) / (pp * c("p_vstages"))))
                .otherwise(pl.min_horizontal(pp, m)))
    # Full recompute re-materialises one layer's activations during its backward.
    recompute_transient = pl.when(c("p_recompute") == "full").then(full_layer).otherwise(0.0)
    v = c("m_vocab").cast(pl.Float64)
    # Output logits: transformers' path (HF_LOGIT_BYTES, plus what soft-capping keeps); a vocab-parallel loss what its
    # runtime holds at the loss's forward (Runtime.vocab_ce_logit_bytes: Megatron's fused loss the fp32 softmax
    # beside the 16-bit logits, 6; nanotron's the fp32 cast and the loss's max-subtracted fp32 copy, 8).
    hf = runtime_is(lambda r: not r.fused_vocab_ce)
    logit_bpe = pl.when(hf).then(HF_LOGIT_BYTES + softcap_kept_bytes()).otherwise(runtime_value("vocab_ce_logit_bytes"))
    logits = pl.when(c("p_fused_head")).then(fused_head_bytes(s * b, v / t, h)).otherwise(s * b * v / t * logit_bpe)
    # The second stage keeps one micro-batch fewer in flight under 1F1B; with an uneven split it may hold the most
    # layers (a middle stage), so it can be the peak rank.
    inflight_mid = (pl.when(c("p_pp") <= 2).then(0.0)
                    .when(c("p_schedule") == "gpipe").then(m)
                    .otherwise(pl.min_horizontal(pp - 1.0, m)))
    df = df.with_columns(_inflight=inflight, _transient=recompute_transient)
    inflight, recompute_transient = c("_inflight"), c("_transient")
    return df.with_columns(
        d_act_per_layer=per_layer,
        d_inflight_microbatches=inflight,
        d_act_first=per_layer * c("d_layers_first") * inflight + recompute_transient,
        d_act_last=per_layer * c("d_layers_last") + recompute_transient,
        d_act_mid=per_layer * c("d_layers_max") * inflight_mid + recompute_transient,
        d_logits_bytes=logits,
    ).drop("_sbh", "_full", "_per_layer", "_inflight", "_transient")


def softcap_kept_bytes() -> pl.Expr:
    """Bytes per full-vocabulary logit that soft-capped logits (ModelSpec.final_logit_softcapping, column
    m_logit_softcap) keep beyond plain ones on transformers' logits path, 0 for a model without them.

    transformers' Gemma2ForCausalLM.forward (models/gemma2/modeling_gemma2.py:519-523 in 5.24; the same three lines in
    4.44, whose forward then upcasts with `logits.float()` as Llama's does): `logits / cap`, `torch.tanh(logits)`,
    `logits * cap`, each a new [tokens, vocab] tensor in the head's dtype. Dividing and multiplying by a Python scalar
    save nothing for the backward, so their inputs are freed as each result is rebound to `logits`; tanh saves its
    output (its backward is grad * (1 - y^2)), which stays alive from the forward to the head's backward, through the
    fp32 tensors the plain path already holds (HF_LOGIT_BYTES per logit). At most two of the chain's
    tensors exist at once while it runs (4 B), less than the loss's moment it precedes: the peak grows by that one
    kept tensor, the compute dtype's bytes per logit. Not on fused heads (Liger's FLCE caps each chunk inside its
    kernel; TRL's chunked head is left as it is) nor on Megatron/nanotron's vocab-parallel loss (no Gemma 2 support
    there)."""
    return pl.when(c("m_logit_softcap") > 0).then(compute_bytes()).otherwise(0.0)


def liger_chunk_rows(bt: pl.Expr, v: pl.Expr, h: pl.Expr) -> pl.Expr:
    """Rows of one chunk of Liger's fused linear cross entropy: next_power_of_2(ceil(BT / ceil(V / H))), at most BT
    (liger_kernel/ops/fused_linear_cross_entropy.py:68-69 at ead96b61; the same rule at 1dce7fd4, 2024-09)."""
    inc = (v / h).ceil()
    rows = (bt / inc).ceil().clip(lower_bound=1.0)
    return pl.min_horizontal(2.0 ** rows.log(2.0).ceil(), bt)


def fused_head_bytes(bt: pl.Expr, v: pl.Expr, h: pl.Expr) -> pl.Expr:
    """What the head holds when it runs as Liger's fused linear cross entropy (plan fused_head) instead of
    materialising BT x V logits: the forward computes the loss and both gradients chunk by chunk
    (liger_kernel/ops/fused_linear_cross_entropy.py at ead96b61): one chunk's logits (:114; the 2024-09 build at
    1dce7fd4 also upcast them to fp32, :69, hence 6 bytes per element, the larger), their softmax gradient written
    in place (:162), `grad_input` (BT x H in the input's dtype, :72) and `grad_weight` (V x H in the weight's dtype,
    :77-81; fp32 only when an accum_dtype is passed, which transformers' and ms-swift's Liger hooks do not), all
    alive until the backward consumes them."""
    return liger_chunk_rows(bt, v, h) * v * 6.0 + bt * h * 2.0 + v * h * 2.0


def reference_model(df: pl.DataFrame) -> pl.DataFrame:
    """The frozen reference of DPO/IPO.

    live: TRL prepares it like the policy (ZeRO-3 / FSDP shard it; below ZeRO-3 DeepSpeed holds a full replica),
    bf16 weights only; its forward runs under no_grad after the policy forward, so its logits (bf16 + fp32
    log-softmax) are a transient on top of the policy's stored activations. offloaded: weights live in host memory
    (NeMo-Aligner swaps them in), a layer at a time on the GPU. precomputed: nothing during the step."""
    live = c("w_reference") == "live"
    off = c("w_reference") == "offloaded"
    sharded = (c("p_zero") >= 3)
    w = c("d_params_rank") * pl.when(sharded).then(2.0 / c("p_dp")).otherwise(2.0)
    layer = c("m_layer_params").cast(pl.Float64) * 2.0 / _tp()
    s = memory_seq_len() / c("p_cp")
    b = c("p_micro_batch").cast(pl.Float64) * c("w_seqs_per_sample")
    v = c("m_vocab").cast(pl.Float64) / _tp()
    # Under a fused head the reference's no-grad forward runs the same chunked head: one chunk's logits at a time.
    head = pl.when(c("p_fused_head")).then(liger_chunk_rows(s * b, v, c("m_hidden").cast(pl.Float64)) * v * 6.0)
    transient = head.otherwise(s * b * v * 6.0) + c("d_act_per_layer")
    return df.with_columns(
        d_ref_weight_bytes=pl.when(live).then(w).when(off).then(layer).otherwise(0.0),
        d_ref_transient_bytes=pl.when(live | off).then(transient).otherwise(0.0),
    )


def gathered_param_dtype_bytes() -> pl.Expr:
    """Bytes per element of the parameters ZeRO-3 / FSDP gather: the dtype they are trained in (FSDP's param_dtype
    under mixed precision, fp32 without it; DeepSpeed's 16-bit partitions), 4 where plain torch trains parameters
    loaded in fp32 (Runtime.params_as_loaded with master weights)."""
    return pl.when(runtime_is(lambda r: r.params_as_loaded) & c("w_master_fp32")).then(4.0).otherwise(compute_bytes())


def zero3_gathered_bytes(w_b: pl.Expr) -> pl.Expr:
    """Unsharded parameters a ZeRO-3 / FULL_SHARD rank holds at the backward's peak (the head's backward), one rule
    per engine, in bytes of w_b per element. The generic and the TRL memory rules both read it (fsdp_gathered,
    features.trl.trl_memory).

    - DeepSpeed ZeRO-3 (Runtime.zero3_reuse_distance). Over one rank it gathers nothing: a partition of world size 1
      is the parameter itself (deepspeed 0.19.8 runtime/zero/partition_parameters.py:1559-1560
      `_no_gather_coalesced`). Over more, once the step's trace is recorded, a submodule's parameters are released
      after its forward unless a module within stage3_max_reuse_distance elements ahead in the trace uses them again
      (partitioned_param_coordinator.py:653-662 `__params_to_release`: it walks the trace from the current step and
      discards from the release set every parameter met before `params_traversed` reaches the distance). Ahead of a
      module's forward lie the modules after it, then the backward back to it, so it is kept iff twice the
      parameters after it stay under the distance: the head always (its backward comes next), the last k layers with
      head + (k-1) layers < distance / 2, and everything (the input embedding included) where head + all layers
      are. With the 1e9 our configs, HF's examples, ms-swift's zero3.json and DeepSpeed's own default set
      (STAGE3_MAX_REUSE_DISTANCE), that is the head plus ~5e8 parameters' worth of layers, all of a smaller model.
      The prefetch of the next submodules (stage3_prefetch_bucket_size "auto" = 0.9 hidden^2 elements,
      :380-406, capped by stage3_max_live_parameters 1e9) adds one bucket.
    - FSDP FULL_SHARD (FSDP1 and FSDP2) frees a unit's unsharded parameters after its forward, except the root's
      (torch 2.13 distributed/fsdp/_runtime_utils.py:493-499 `free_unsharded_flat_param = not state._is_root and
      ...`; FSDP2 _fully_shard/_fsdp_state.py:203-207 `post_forward_mesh_info = None` for the root), and in the
      backward gathers the next unit ahead of the current (BACKWARD_PRE; limit_all_gathers allows two all-gathers in
      flight, _limiter_utils.py:15): two blocks at once plus what stays gathered, which depends on the wrapping.
      FSDP2 as accelerate 1.16 wraps it (utils/fsdp_utils.py:876-904: the input embedding its own unit, resharded
      after its forward; [final norm, head] one unit with reshard_after_forward False; the tied embedding in that
      tail) and as torchtitan does (embedding, blocks, [norm, output] with reshard_after_forward False) keep the head:
      V x h. Counted: 2 blocks + V x h, the CPU trl+fsdp rows' measured peaks agree (5.8 % composition error; with
      the untied embedding also kept, 7.7 %). Not modelled, for want of a plan field naming the FSDP version: FSDP1
      under accelerate's TRANSFORMER_BASED_WRAP leaves embedding, norm and head in the root, so an untied model keeps
      one more V x h (the Liger example rows ran FSDP1).
    Megatron's and nanotron's ZeRO-3 take FSDP's rule."""
    from perfpredict.core.frameworks import DS_PREFETCH_BUCKET_HIDDEN2, STAGE3_MAX_REUSE_DISTANCE

    t = _tp()
    p_layer = c("m_layer_params").cast(pl.Float64) / t
    vh = c("m_vocab").cast(pl.Float64) * c("m_hidden") / t
    layers = c("m_layers").cast(pl.Float64)
    half = STAGE3_MAX_REUSE_DISTANCE / 2.0
    kept_layers = ((half - vh) / p_layer).ceil().clip(lower_bound=0.0, upper_bound=None)
    kept_layers = pl.min_horizontal(kept_layers, layers)
    ds = pl.when(vh + layers * p_layer < half).then(c("d_params_rank")).otherwise(vh + kept_layers * p_layer)
    prefetch = DS_PREFETCH_BUCKET_HIDDEN2 * c("m_hidden").cast(pl.Float64) ** 2
    reuse = runtime_is(lambda r: r.zero3_reuse_distance)
    elements = (pl.when(reuse & (c("p_dp") * c("p_cp") == 1)).then(0.0)
                .when(reuse).then(pl.min_horizontal(ds + prefetch, c("d_params_rank")))
                .otherwise(2.0 * p_layer + vh))
    return elements * w_b


def fsdp_gathered(df: pl.DataFrame) -> pl.DataFrame:
    """Unsharded parameters alive at the backward's peak: ZeRO-3 / FULL_SHARD as zero3_gathered_bytes says per
    engine; FSDP's SHARD_GRAD_OP (zero 2 here) keeps the whole unsharded model from forward to backward. Under
    transformers' Trainer with gradient accumulation, FSDP also keeps every block's unsharded gradient, in the compute
    dtype, from the first micro-batch's backward to the last one's reduce-scatter (core.frameworks
    Runtime.no_sync_keeps_unsharded_grads).

    Gathered here in 16 bits, as these rows always were (the mixed-precision param_dtype of the GPU configs); the
    collect harness's CPU FSDP2 runs gather their fp32 parameters (no MixedPrecisionPolicy, collect/harness/
    parallel.py:216-220, 249) but counting that makes their composed peaks worse (22.6 -> 22.8 %), so it waits for a
    measured reason. TRL rows gather in the policy's dtype (features.trl, gathered_param_dtype_bytes)."""
    w_b = pl.lit(2.0)
    gathered = (pl.when(runtime_is(lambda r: r.zero2_keeps_unsharded) & (c("p_zero") == 2)).then(c("d_params_rank") * w_b)
                .when(c("p_zero") >= 3).then(zero3_gathered_bytes(w_b)).otherwise(0.0))
    return df.with_columns(d_gathered_bytes=gathered + no_sync_grad_bytes())


def fresh_grads_rows() -> pl.Expr:
    """Rows whose gradients do not exist when the backward starts: transformers' Trainer frees them after every
    optimizer step (`optimizer.zero_grad()`, set_to_none by default in torch), so with one micro-batch per step each
    is allocated during the backward as the activations it consumes are freed (Runtime.frees_grads_each_step: FSDP's
    sharded gradients are written unit by unit by its post-backward hooks; DDP's .grad per parameter)."""
    return hf_trainer() & (c("p_grad_accum") == 1) & (c("p_pp") == 1) & runtime_is(lambda r: r.frees_grads_each_step)


def fresh_grad_bpp(transient: pl.Expr) -> pl.Expr:
    """Gradient bytes per parameter to count at the backward's peak on fresh_grads_rows: the backward holds
    max(gradients, activations + the head's transient) on top of weights and optimizer state, not both, so only
    the gradients beyond that transient (`transient` bytes) count. The optimizer step still sees all of them
    (d_grad_bpp_step)."""
    return (c("d_grad_bpp") - transient / c("d_params_rank").clip(lower_bound=1.0)).clip(lower_bound=0.0)


def fresh_grads(df: pl.DataFrame) -> pl.DataFrame:
    """fresh_grad_bpp on the rows features.trl does not handle itself (it applies the same rule with its own head
    transient)."""
    from perfpredict.features.trl import is_trl

    rows = fresh_grads_rows() & ~is_trl()
    return df.with_columns(d_grad_bpp=pl.when(rows).then(fresh_grad_bpp(c("d_act_first") + c("d_logits_bytes")))
                           .otherwise(c("d_grad_bpp")))


def optimizer_step(df: pl.DataFrame) -> pl.DataFrame:
    """The optimizer step's own transients, d_step_transient_bytes (peak_memory weighs that moment against the
    backward's: the activations, logits and gathered parameters are gone by then, every gradient is alive):

    - DeepSpeed ZeRO 1-3 (core.frameworks Runtime.step_fp32_grad_copy_from_zero): the unit's 16-bit gradients
      flattened (2 B per parameter, freed after the cast) and cast to an fp32 `.grad` (4 B) that lives through the
      unit's step; the unit is the rank's partition, at ZeRO-3 one sub-group of at most DS_SUB_GROUP_SIZE
      parameters. In fp32 the cast returns the flattened tensor itself: 4 B.
    - The Trainer's torch AdamW on a GPU (Runtime.trainer_torch_adamw): foreach's `exp_avg_sq_sqrt`, one more copy of
      the second moment of the unit being stepped (d_moment_bytes per parameter); none on a CPU (foreach is off
      there), so the CPU-measured rows are unchanged.
    Neither applies with optimizer offload (the step runs on the host), nor to TRL's DeepSpeed ZeRO 0-2 fp32 rows,
    whose step features.trl already folds into their gradient bytes (d_step_in_grads)."""
    from perfpredict.core.frameworks import DS_SUB_GROUP_SIZE

    d = (c("p_dp") * c("p_cp")).cast(pl.Float64)
    shard = c("d_params_rank") / pl.when(c("p_zero") >= 1).then(d).otherwise(1.0)
    copies = runtime_from_zero("step_fp32_grad_copy_from_zero")
    unit = pl.when(copies & (c("p_zero") >= 3)).then(pl.min_horizontal(shard, pl.lit(float(DS_SUB_GROUP_SIZE)))).otherwise(
        shard)
    fp32 = c("w_precision") == "fp32"
    grad32 = pl.when(copies).then(4.0).otherwise(0.0)
    flat16 = pl.when(copies & ~fp32).then(2.0).otherwise(0.0)
    # foreach where the workload's optimizer says so (core.frameworks Optimizer.foreach_step), else the runtime's
    # default; never on a CPU.
    named = optimizer_rule("foreach_step")
    runtime_default = hf_trainer() & runtime_is(lambda r: r.trainer_torch_adamw)
    foreach = pl.when(pl.when(named.is_null()).then(runtime_default).otherwise(named) & ~on_cpu()).then(
        c("d_moment_bytes")).otherwise(0.0)
    skip = c("p_offload") | c("d_step_in_grads")  # trl_memory, earlier in memory_descriptors, sets it on every row
    per_param = pl.max_horizontal(grad32 + flat16, grad32 + foreach)
    return df.with_columns(d_step_transient_bytes=pl.when(skip).then(0.0).otherwise(unit * per_param))


def ddp_buckets(df: pl.DataFrame) -> pl.DataFrame:
    """PyTorch DDP's gradient buckets: one more copy of the replica's gradients, for the whole run.

    torch.nn.parallel.DistributedDataParallel (bucket_cap_mb=25, gradient_as_bucket_view=False by default) copies
    every gradient into flat all-reduce buckets allocated at wrap time; the bucket cap sets how many buckets, not
    their total, which is the gradient bytes. PyTorch's docs for gradient_as_bucket_view: "the saved memory size
    will be equal to the total gradients size" (pytorch.org/docs torch.nn.parallel.DistributedDataParallel; PR
    pytorch/pytorch#41954 measured ~1 GB less peak for a ~1 GB-gradient model). Plans here: the PyTorch-native
    stack (framework fsdp) at zero 0 over dp > 1 without TP/PP, which collect runs as DDP
    (perfpredict/collect/harness/parallel.py strategy). Not FSDP (zero 2/3: gradients are sharded in place), not
    Megatron (its DDP accumulates into contiguous buffers the buckets are views of), not DeepSpeed (own reducer).
    Our CPU memory label cannot see these buckets (allocated in C++, outside the profiled step): for those rows the
    measured peak plus this term is the true peak.
    TRL on plain accelerate (runtime ddp) is DDP too: accelerator.prepare wraps the model in
    DistributedDataParallel with the default bucket settings.

    DeepSpeed's own reducer at ZeRO 1-3 holds fixed contiguous-gradient buckets instead (core.frameworks
    Runtime.reduce_buckets_zero12_zero3, reduce_bucket_size "auto" = DS_REDUCE_BUCKET_HIDDEN2 x hidden^2 elements in
    the gradients' dtype): tens of MB, counted for the whole step."""
    from perfpredict.core.frameworks import DS_REDUCE_BUCKET_HIDDEN2, RUNTIMES

    ddp = (runtime_is(lambda r: r.ddp_buckets_at_zero0) & (c("p_zero") == 0) & (c("p_dp") * c("p_cp") > 1)
           & (c("p_tp") == 1) & (c("p_pp") == 1))
    n = pl.lit(0.0)
    for name, r in RUNTIMES.items():
        z12, z3 = r.reduce_buckets_zero12_zero3
        n = (pl.when((c("d_runtime") == name) & c("p_zero").is_in([1, 2])).then(float(z12))
             .when((c("d_runtime") == name) & (c("p_zero") >= 3)).then(float(z3)).otherwise(n))
    grad_b = compute_bytes()
    h = c("m_hidden").cast(pl.Float64)
    buckets = n * DS_REDUCE_BUCKET_HIDDEN2 * h * h * grad_b
    return df.with_columns(
        d_ddp_bucket_bytes=pl.when(ddp).then(c("d_params_rank") * c("d_grad_bpp")).otherwise(buckets))


def host_memory(df: pl.DataFrame) -> pl.DataFrame:
    """Host RAM the offloaded states pin, per rank and per node (every rank of the node: c_gpus_per_node of them),
    for the check that a node holds them (features.plans.refuse_host_ram). Bytes per parameter of the rank's shard:

    - the optimizer's master copy and Adam moments (d_state_bpp's optimizer part: 12 with a separate fp32 master, 8
      for FSDP, whose fp32 parameters are the master) and an fp32 gradient the host optimizer reads (4):
      DeepSpeed ZeRO-3 `converted.clone().detach()` onto the offload device and a pinned fp32 `subgroup_gradient_buffer`
      as its .grad (deepspeed runtime/zero/stage3.py:1120-1122, 1288-1292); ZeRO-1/2 the pinned fp32 partition and
      its pinned fp32 grad (stage_1_and_2.py:492-497, 840-844); Megatron's HybridDeviceOptimizer a pinned CPU copy
      of the fp32 main parameter and a pinned grad copy (megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py
      _get_sub_optimizer_param_groups, _set_sub_optimizer_grads); FSDP's CPUOffload the optimizer step on the host.
    - DeepSpeed's pinned 16-bit staging of the shard (Runtime.offload_16bit_host_buffer): ZeRO-3's
      `grad_partitions_flat_buffer` in the gradient-accumulation dtype on the offload device (stage3.py:742-746),
      ZeRO-1/2's `param_buffer_of_bit16_for_cpu_offload_groups` (stage_1_and_2.py:498-505) and, when it
      accumulates over micro-batches, a 16-bit `accumulated_grads_in_cpu` buffer per parameter
      (stage_1_and_2.py:1516-1556, 1650-1657).
    - the parameters themselves where they live on the host: ZeRO-3 offload_param's pinned 16-bit partitions
      (`param_groups_fp16_flat_cpu_memory`, stage3.py:839-862); FSDP's CPUOffload(offload_params) keeps the sharded
      fp32 parameters there, pinned (torch distributed/fsdp/_fully_shard/_fsdp_param.py:312-315; FSDP1
      _flat_param.py:1260-1265 `_local_shard` and `_cpu_grad`).
    - an offloaded reference's 16-bit weights (reference_model: they live in host memory, a layer at a time on the
      GPU).
    Expert weights shard over d/ep ranks, as on the GPU (state_bytes_per_param). Transients at start-up (the
    `.to()` before the clone, the checkpoint load) are left out: the steady state is what must fit."""
    gib = float(1 << 30)
    w16 = compute_bytes()
    staging = runtime_is(lambda r: r.offload_16bit_host_buffer)
    accumulates = staging & (c("p_zero") < 3) & (c("p_grad_accum") > 1)
    weights = pl.when(runtime_is(lambda r: r.weights_fp32)).then(4.0).otherwise(w16)
    per_param = (c("d_optim_bpp_unsharded") + 4.0 + pl.when(staging).then(w16).otherwise(0.0)
                 + pl.when(accumulates).then(w16).otherwise(0.0)
                 + pl.when(params_on_host()).then(weights)
                 .otherwise(0.0))
    # evaluated once (read twice below; an eager with_columns evaluates a repeated expression each time)
    df = df.with_columns(_per_param=per_param)
    per_param = c("_per_param")
    d = (c("p_dp") * c("p_cp")).cast(pl.Float64)
    shard = pl.when(c("p_zero") >= 1).then(d).otherwise(1.0)
    de = pl.when(c("p_zero") >= 1).then(pl.max_horizontal(d / c("p_ep").cast(pl.Float64), pl.lit(1.0))).otherwise(1.0)
    experts = c("d_layers_max") * c("d_expert_params_layer_rank")
    offloaded = pl.when(c("p_offload")).then(
        c("d_params_rank") * per_param / shard + experts * per_param * (1.0 / de - 1.0 / shard)).otherwise(0.0)
    ref = pl.when(c("w_reference") == "offloaded").then(c("d_params_rank") * 2.0).otherwise(0.0)
    df = df.with_columns(_rank=offloaded + ref)
    rank = c("_rank")
    return df.with_columns(d_host_ram_rank_gib=rank / gib,
                           d_host_ram_node_gib=rank * pl.min_horizontal(c("c_gpus_per_node"), c("c_gpus")) / gib
                           ).drop("_per_param", "_rank")


def peak_memory(df: pl.DataFrame) -> pl.DataFrame:
    """The peak rank's bytes: the worst of the first stage (most micro-batches in flight, the embedding), the
    fullest middle stage (uneven splits) and the last (head, logits, the reference's transient), each at the worse of
    two moments, the backward and the optimizer step (d_peak_moment). d_peak_*_gib are that rank's parts at that
    moment and add up to d_mem_gib; d_states_gib etc. stay the per-part maxima over stages (features)."""
    gib = float(1 << 30)
    bpp = c("d_weight_bpp") + c("d_grad_bpp") + c("d_optim_bpp")
    experts = c("d_expert_params_layer_rank") * c("d_expert_state_bpp_extra")
    bpp_step = c("d_weight_bpp") + c("d_grad_bpp_step") + c("d_optim_bpp")
    # Each stage's states (at the backward and at the optimizer step) and, below, each moment's total as columns,
    # each evaluated once: the verdicts and parts below read them several times over, and an eager with_columns
    # evaluates a repeated expression each time it appears (the same numbers).
    df = df.with_columns(**{f"_states_{k}": c(f"d_params_{k}") * bpp + c(f"d_layers_{'max' if k == 'mid' else k}")
                            * experts for k in ("first", "mid", "last")},
                         **{f"_states_step_{k}": c(f"d_params_{k}") * bpp_step
                            + c(f"d_layers_{'max' if k == 'mid' else k}") * experts for k in ("first", "mid", "last")})
    states = {k: c(f"_states_{k}") for k in ("first", "mid", "last")}
    single = c("p_pp") == 1
    parts = {  # stage: (states, activations, logits, reference, other)
        "first": (states["first"], c("d_act_first"),
                  pl.when(single).then(c("d_logits_bytes")).otherwise(0.0),
                  c("d_ref_weight_bytes") + pl.when(single).then(c("d_ref_transient_bytes")).otherwise(0.0),
                  c("d_gathered_bytes") + c("d_ddp_bucket_bytes")),
        "mid": (states["mid"], c("d_act_mid"), pl.lit(0.0), c("d_ref_weight_bytes"), c("d_gathered_bytes") + c("d_ddp_bucket_bytes")),
        "last": (states["last"], c("d_act_last"), c("d_logits_bytes"),
                 c("d_ref_weight_bytes") + c("d_ref_transient_bytes"), c("d_gathered_bytes") + c("d_ddp_bucket_bytes")),
    }
    # The optimizer step (optimizer_step): activations, logits, the reference's transient and the gathered
    # parameters are gone, every gradient of the shard is alive, and the step's own transients sit on top; its
    # transients are reported with "other".
    at_step = {k: (c(f"_states_step_{k}"), pl.lit(0.0), pl.lit(0.0), c("d_ref_weight_bytes"),
                   c("d_ddp_bucket_bytes") + c("d_step_transient_bytes")) for k in ("first", "mid", "last")}
    df = df.with_columns(**{f"_backward_{k}": pl.sum_horizontal(*v) for k, v in parts.items()},
                         **{f"_step_{k}": pl.sum_horizontal(*v) for k, v in at_step.items()})
    backward = {k: c(f"_backward_{k}") for k in parts}
    step = {k: c(f"_step_{k}") for k in at_step}
    totals = {k: pl.max_horizontal(backward[k], step[k]) for k in parts}
    mid_counts = (c("p_pp") > 2).cast(pl.Float64)  # a middle stage exists
    df = df.with_columns(
        _first=totals["first"], _mid=totals["mid"] * mid_counts, _last=pl.when(single).then(0.0).otherwise(totals["last"]))
    # Ties go to the first stage, then the last (same order as before uneven splits existed).
    at = (pl.when((c("_first") >= c("_last")) & (c("_first") >= c("_mid"))).then(pl.lit("first"))
          .when(c("_last") >= c("_mid")).then(pl.lit("last")).otherwise(pl.lit("mid")))
    df = df.with_columns(d_peak_stage=at)
    # Which moment of that stage is the peak: the backward's (ties) or the optimizer step's.
    stepping = pl.lit(False)
    for k in parts:
        stepping = pl.when(c("d_peak_stage") == k).then(step[k] > backward[k]).otherwise(stepping)
    df = df.with_columns(d_peak_moment=pl.when(stepping).then(pl.lit("step")).otherwise(pl.lit("backward")))

    def pick(i: int) -> pl.Expr:
        chosen = {k: pl.when(c("d_peak_moment") == "step").then(at_step[k][i]).otherwise(parts[k][i]) for k in parts}
        return (pl.when(c("d_peak_stage") == "first").then(chosen["first"])
                .when(c("d_peak_stage") == "last").then(chosen["last"]).otherwise(chosen["mid"]))

    names = ("states", "act", "logits", "ref", "other")
    df = df.with_columns(**{f"d_peak_{n}_gib": pick(i) / gib for i, n in enumerate(names)})
    peak = pl.sum_horizontal(*[c(f"d_peak_{n}_gib") for n in names])
    return df.with_columns(
        d_states_gib=pl.max_horizontal(states["first"], states["last"]) / gib,
        d_act_gib=pl.max_horizontal(c("d_act_first"), c("d_act_last")) / gib,
        d_logits_gib=c("d_logits_bytes") / gib,
        d_ref_gib=(c("d_ref_weight_bytes") + c("d_ref_transient_bytes")) / gib,
        d_mem_gib=peak,
    ).with_columns(d_mem_frac=c("d_mem_gib") / c("g_memory_gib")).drop(
        "_first", "_mid", "_last", *[f"_{w}_{k}" for w in ("states", "states_step", "backward", "step")
                                     for k in ("first", "mid", "last")])


def memory_descriptors(df: pl.DataFrame) -> pl.DataFrame:
    from perfpredict.features.trl import head_passes, trl_memory

    for f in (plan_defaults, head_passes, stage_layout, expert_parallel, param_shard, state_bytes_per_param,
              activation_coefficients, activations, reference_model, fsdp_gathered, ddp_buckets, trl_memory,
              fresh_grads, optimizer_step, host_memory, peak_memory):
        df = f(df)
    return df
