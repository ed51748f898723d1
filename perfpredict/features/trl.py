"""What TRL's preference trainers allocate and run per step, beyond a plain causal-LM step (features, never labels).

Read from the installed sources of TRL 1.16.0, transformers 5.24.0 and accelerate 1.15.0 (site-packages paths):

- Batch layout. DPOTrainer's collator repeats the prompts for chosen and rejected (trl/trainer/dpo_trainer.py:317
  `prompts = [...] * 2` in the vision collator; the text collator builds the same layout), pads chosen and
  rejected to the longest completion of the batch (:349 `torch.cat(tuple(pad([chosen_ids, rejected_ids])))`) and
  puts the left-padded prompt in front (:351), so one policy forward runs 2B rows of (longest prompt + longest
  completion) tokens. KTOTrainer (trl/trainer/kto_trainer.py:345) runs B completions with gradient and, for the
  KL term, B mismatched completions through the policy under no_grad (:1360-1365 `with torch.no_grad(): ...
  KL_per_token_logps = model(**KL_model_kwargs, ...)`). CPOTrainer / ORPOTrainer (trl/experimental/cpo/
  cpo_trainer.py:640-668, orpo/orpo_trainer.py:640-660 `concatenated_inputs`) pad chosen and rejected to the
  longer of the two and concatenate them on dim 0: 2B rows too.
- Logits path. DPO and KTO never materialise the [2B, T, V] logits: `add_fused_lm_head` (trl/trainer/utils.py:1548,
  installed at dpo_trainer.py:960, kto_trainer.py:967) replaces the head with `_ChunkedLogProbFunction`
  (trl/kernels/chunked_logprob.py:300-440): tiles of [min(N, 4096) tokens, 32768 vocabulary columns]
  (utils.py:1506 `_CHUNKED_LOGPROB_CHUNK_SIZE = 32768`, chunked_logprob.py:31 `TOKEN_CHUNK_SIZE = 4096`) in the
  compute dtype; without Triton (CPU) every position is scored (utils.py:1642 `compact = _use_triton(...)`) and
  each tile is folded in torch with fp32 temporaries (chunked_logprob.py:211 `_forward_tile`: `z = tile.float()`,
  `e = exp(z - m)`, `e * z` for the entropy DPO requests at dpo_trainer.py:955-958); on GPU a Triton kernel folds
  the tile in place. The backward recomputes every tile (one more head GEMM per tile) and accumulates
  grad_hidden [N, H] and grad_weight [V, H] in fp32 (chunked_logprob.py:405-411 "Always accumulate in fp32").
  CPOTrainer (SimPO) and ORPOTrainer call the model's own forward: transformers' LlamaForCausalLM returns
  logits [2B, T, V] in the compute dtype (no fp32 upcast without labels), and `get_batch_logps`
  (cpo_trainer.py:752-790) takes `selective_log_softmax` (trl/trainer/utils.py:538) over them; its backward builds
  an fp32 gradient of the logits. ORPO adds the chosen half's NLL (orpo_trainer.py:783-800: `.contiguous()` copy
  of B*T*V logits, then nn.CrossEntropyLoss, whose log-softmax stays for the backward).
- Reference. Live: `ref_model` is created in the policy's dtype (dpo_trainer.py:924 `setdefault("dtype",
  self.model.dtype)`) and prepared like the policy, without gradients or optimizer (:984-990: `prepare_deepspeed`,
  which shards it only at ZeRO-3, `prepare_fsdp`, or `accelerator.prepare_model(evaluation_mode=True)`, a full
  replica); its forward runs under no_grad with gradient checkpointing off (:1318-1338) after the policy forward,
  through the same fused head (:962). Precomputed (`precompute_ref_log_probs=True` without a `ref_model`): no
  reference model at all (:908-914 `self.ref_model = None`); its log-probs are dataset columns read at :1318-1319;
  under FSDP the reference built for precomputing is dropped afterwards (:1033-1034). None: SimPO (CPO) and ORPO
  have no reference. KTO's live reference runs both the KL and the completion batch (kto_trainer.py:1425-1436).
- Gradient checkpointing is transformers' (`gradient_checkpointing_enable`, use_reentrant False as TRL sets it):
  each decoder layer's input is kept and the layer recomputed in the backward (features.memory recompute full).
- Optimizer and wrapping: torch AdamW (fp32 m and v for fp32 parameters); accelerate's DDP, DeepSpeed and FSDP
  states follow features.memory.state_bytes_per_param through the framework's runtime (core.frameworks RUNTIME).

All objective/trainer-specific rules are the TRAINERS table below; memory.py and compose.py read the columns this
module adds (d_head_*), never the objective names.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from perfpredict.core.errors import require
from perfpredict.core.frameworks import TRL_FRAMEWORKS
from perfpredict.core.objectives import OBJECTIVE_TABLE
from perfpredict.core.objectives import TRL_OBJECTIVES as CORE_TRL_OBJECTIVES
from perfpredict.features.compute import compute_bytes, no_sync_grad_bytes, on_cpu, runtime_from_zero, runtime_is
from perfpredict.features.memory import (
    fresh_grad_bpp,
    fresh_grads_rows,
    gathered_param_dtype_bytes,
    memory_seq_len,
    softcap_kept_bytes,
    zero3_gathered_bytes,
)

c = pl.col

TOKEN_TILE = 4096  # trl/kernels/chunked_logprob.py:31 TOKEN_CHUNK_SIZE
VOCAB_TILE = 32768  # trl/trainer/utils.py:1506 _CHUNKED_LOGPROB_CHUNK_SIZE
# The head's tile buffer is allocated at the full chunk width even when the vocabulary is narrower
# (chunked_logprob.py:347 and :413 `mm_buf = torch.empty((min(N, TOKEN_CHUNK_SIZE), chunk_size), ...)`): at a small
# vocabulary it, not the vocabulary, sets the head's memory.
# Temporaries per tile element of the torch fold used without Triton (CPU): the forward's z = tile.float(),
# the masks and masked copy of is_top1, e = exp(z - m), e * z (chunked_logprob.py:211-255); the backward's
# recomputed tile and its gradient terms (:257-300). Counted by replaying _ChunkedLogProbFunction on CPU under
# torch.profiler's allocation events (the running maximum of allocated minus freed bytes; collect trl's label
# method): 13 bytes per element forward, 29 backward when only the log-probs carry a gradient (DPO/KTO: the
# entropy is a metric, so its gradient is None, `ctx.set_materialize_grads(False)`; 33 if it had one), at every N,
# V and h tried (N 258-4500, V 2k-32k, h 128-640), on top of mm_buf, grad_hidden [N, h] and grad_weight [V, h]
# (fp32 accumulators, :405-411).
CPU_FOLD_FWD_BYTES = 13.0
CPU_FOLD_BWD_BYTES = 29.0
# The full-logits trainers, counted the same way on CPU over CPOTrainer.get_batch_logps and its backward: 4 + 7 bytes
# per logit of the 2B rows (the fp32 logits, their gradient and selective_log_softmax's per-row logsumexp path).
# ORPO's chosen-half nn.CrossEntropyLoss keeps its log-softmax output (the logits' dtype) for the backward: one more
# logit-sized tensor per chosen-half logit at the peak. Replayed through a real LlamaForCausalLM forward and backward
# (orpo_trainer.py:777-807 against the same step without the NLL, shapes t1-2k/t2-8k/t4-32k/t5-16k, with and without
# checkpointing) the peak grows by 3.9-4.1 bytes per chosen-half fp32 logit: the `.contiguous()` copy is gone before
# the backward and the NLL's own backward transients fall after the peak (in isolation, without the layers' backward,
# they add 4 more: 8, which is what the earlier 12 over-counted).
FULL_EXTRA_BYTES = 7.0
# transformers 5.24 LlamaDecoderLayer under autograd (saved tensors counted with torch.autograd.graph
# .saved_tensors_hooks on the installed modeling_llama.py / sdpa_attention.py): each RMSNorm keeps its input, the
# normalised product and the Linear's flattened input (3 x s b h per norm: 12 bytes per s b h in features.memory's
# 16-bit units, 8 in its generic rule), and sdpa_attention_forward repeats K and V to all heads before SDPA
# (repeat_kv), so GQA saves nothing on the stored K and V. Once per model: the final norm (2) and the head's
# flattened input (1) in s b h units, and the 4-D float attention mask [b, 1, s, s] shared by all layers.
HF_REPLICATED_COEF = 12.0
# Cost of the fused head's CPU fold in cross-entropy fwd+bwd units (head_passes).
CPU_FOLD_POLICY_CE = 4.5
CPU_FOLD_NOGRAD_CE = 1.0
HF_FINAL_SBH = 3.0


@dataclass(frozen=True)
class Trainer:
    """How one TRL trainer runs an objective."""

    name: str
    head: str  # "fused": chunked log-prob head (no logits); "full": the model's [N, V] logits
    grad_seqs: int  # sequences per sample through the policy with gradient
    nograd_policy_seqs: int = 0  # sequences per sample through the policy under no_grad (KTO's KL batch)
    ref_seqs: int = 0  # sequences per sample through a live reference
    nll_share: float = 0.0  # share of the rows whose NLL runs a second full-vocab loss (ORPO: the chosen half)

    def __post_init__(self) -> None:
        require(self.head in ("fused", "full"), f"trainer head must be fused or full, got {self.head!r}")


def _trainer(objective: str, head: str, **kw) -> Trainer:
    """The trainer of core.objectives' row for `objective` (its TRL trainer class), with how it runs."""
    return Trainer(OBJECTIVE_TABLE[objective].trl_trainer, head, **kw)


TRAINERS: dict[str, Trainer] = {
    "dpo": _trainer("dpo", "fused", grad_seqs=2, ref_seqs=2),
    "ipo": _trainer("ipo", "fused", grad_seqs=2, ref_seqs=2),
    "kto": _trainer("kto", "fused", grad_seqs=1, nograd_policy_seqs=1, ref_seqs=2),
    "simpo": _trainer("simpo", "full", grad_seqs=2),
    "orpo": _trainer("orpo", "full", grad_seqs=2, nll_share=0.5),
}
TRL_OBJECTIVES = tuple(TRAINERS)
require(set(TRL_OBJECTIVES) == set(CORE_TRL_OBJECTIVES),
        f"features.trl models trainers of {sorted(TRL_OBJECTIVES)}, core.objectives names {sorted(CORE_TRL_OBJECTIVES)}")


def _rule(field: str, default: float) -> pl.Expr:
    return c("w_objective").replace_strict({k: float(getattr(t, field)) for k, t in TRAINERS.items()},
                                           default=default, return_dtype=pl.Float64)


def _fused() -> pl.Expr:
    return c("w_objective").replace_strict({k: t.head == "fused" for k, t in TRAINERS.items()}, default=False,
                                           return_dtype=pl.Boolean)


def is_trl() -> pl.Expr:
    return c("p_framework").is_in(list(TRL_FRAMEWORKS))


def trl_mode() -> pl.Expr:
    """The trainer x reference label TRL accuracy is reported by ("dpo live", "orpo none"...); null off TRL."""
    return pl.when(is_trl()).then(pl.concat_str([c("w_objective"), c("w_reference")], separator=" ")).otherwise(None)


def head_passes(df: pl.DataFrame) -> pl.DataFrame:
    """Output-head work per micro-batch, in units of the policy batch's head GEMM ([T x h] @ [h x V]) and its
    full-vocabulary elementwise pass, for the kernel composition (models/compose.py):

    - d_head_fwd_passes: head GEMMs forward. Plain trainers: the policy's forward and the live reference's. TRL's
      fused head recomputes each tile in the backward (one more), and KTO's KL batch and reference KL pass add
      forwards of the same size.
    - d_head_ce_passes: passes over [T, V] of the log-softmax / cross entropy (forward, backward, the reference).
    - d_extra_fwd_passes: layer forwards beyond policy + recompute + reference (KTO's no-grad KL forward, its
      reference's second pass)."""
    live = c("w_reference").is_in(["live", "offloaded"]).cast(pl.Float64)
    # The trainer's rules as columns, each evaluated once (read several times below; an eager with_columns evaluates
    # a repeated expression each time it appears: the same numbers).
    df = df.with_columns(_trl=is_trl() & c("w_objective").is_in(list(TRAINERS)), _fused=_fused(),
                         _nograd=_rule("nograd_policy_seqs", 0.0),
                         _ref_mult=_rule("ref_seqs", 2.0) / _rule("grad_seqs", 2.0))  # reference seqs per policy seq
    trl, fused, nograd, ref_mult = c("_trl"), c("_fused"), c("_nograd"), c("_ref_mult")
    extra_fwd = pl.when(trl).then(nograd + live * (ref_mult - 1.0)).otherwise(0.0)
    df = df.with_columns(_ref_fwd=live * pl.when(trl).then(ref_mult).otherwise(1.0))
    ref_fwd = c("_ref_fwd")
    df = df.with_columns(_fwd=1.0 + ref_fwd + pl.when(trl).then(nograd).otherwise(0.0))
    fwd = c("_fwd")
    # The fused head's fold without Triton (CPU) is torch elementwise work over [N, V] several times over
    # (_forward_tile / _backward_tile): replayed on this CPU against F.cross_entropy forward+backward over the same
    # [N, V] (N 258-2032, V 2k-32k), the policy's fold costs 3.6-5.6 of those beyond its four tile GEMMs, a no-grad
    # forward's 0.8-1.2. In those units (the cross_entropy fwd_bwd probe), for the composition.
    cpu = on_cpu()
    fold = pl.when(trl & fused & cpu).then(
        CPU_FOLD_POLICY_CE + CPU_FOLD_NOGRAD_CE * (ref_fwd + nograd)).otherwise(0.0)
    return df.with_columns(
        d_head_fold_ce=fold,
        d_head_fwd_passes=fwd + pl.when(trl & fused).then(1.0).otherwise(0.0),
        d_head_ce_passes=pl.when(trl & fused & cpu).then(0.0).when(trl & fused).then(2.0 + fwd).otherwise(
            3.0 + ref_fwd + pl.when(trl).then(_rule("nll_share", 0.0) * 3.0).otherwise(0.0)),
        d_extra_fwd_passes=extra_fwd,
        # Passes through the layers per micro-batch (forwards, the backward, the checkpointed recompute): DeepSpeed
        # ZeRO-3 runs its fetch/release hooks on every module with parameters in each of them (compose).
        d_layer_passes=pl.when(trl).then(
            fwd + 1.0 + (c("p_recompute") == "full").cast(pl.Float64)).otherwise(0.0),
    ).drop("_trl", "_fused", "_nograd", "_ref_mult", "_ref_fwd", "_fwd")


def trl_memory(df: pl.DataFrame) -> pl.DataFrame:
    """For TRL rows: the head's transient at the peak (d_logits_bytes), the reference's weights and its forward's
    transient beyond that, replacing the generic rules of features.memory. Other rows pass through unchanged.

    The peak is the larger of (a) the reference / KL forward, after the policy forward, and (b) the head's
    backward, the first op of the backward; both sit on top of the states and the policy's stored activations,
    so d_ref_transient_bytes only carries what (a) needs beyond (b)."""
    trl = is_trl() & c("w_objective").is_in(list(TRAINERS))
    if not df.select(trl.any()).item():  # no TRL row (a GPU ranking): every column below passes through
        return df.with_columns(d_head_bwd_bytes=pl.lit(None, dtype=pl.Float64), d_step_in_grads=pl.lit(False))
    fp32 = c("w_precision") == "fp32"
    ab = compute_bytes()  # autocast's or the parameters' own
    cpu = on_cpu()
    grad_seqs = _rule("grad_seqs", 2.0)
    s = memory_seq_len()  # the longest padded batch where it differs (features.memory)
    n_tok = c("p_micro_batch").cast(pl.Float64) * grad_seqs * s
    h = c("m_hidden").cast(pl.Float64)
    v = c("m_vocab").cast(pl.Float64)
    fused = _fused()
    rows_t = pl.min_horizontal(n_tok, pl.lit(float(TOKEN_TILE)))
    tile = rows_t * pl.min_horizontal(v, pl.lit(float(VOCAB_TILE)))
    mm_buf = rows_t * VOCAB_TILE * ab
    fold_bwd = tile * pl.when(cpu).then(CPU_FOLD_BWD_BYTES).otherwise(0.0)
    fold_fwd = tile * pl.when(cpu).then(CPU_FOLD_FWD_BYTES).otherwise(0.0)
    # (b) fused: fp32 grad_hidden [N, h] and grad_weight [V, h] (cast to the parameter dtype at the end: one more
    # copy unless fp32), the tile buffer and the fold's temporaries; full: the logits and their gradient path.
    cast_copy = pl.when(fp32).then(0.0).otherwise(2.0)
    grads = (4.0 + cast_copy) * (n_tok + v) * h
    fused_bwd = grads + mm_buf + fold_bwd
    # Soft-capped logits keep tanh's output for the backward (features.memory.softcap_kept_bytes).
    full_bwd = grads + n_tok * v * (ab + FULL_EXTRA_BYTES + _rule("nll_share", 0.0) * ab + softcap_kept_bytes())
    head_bwd = pl.when(fused).then(fused_bwd).otherwise(full_bwd)
    # (a) the no-grad forwards: one layer's activations of the reference/KL batch and its head tiles.
    live = c("w_reference").is_in(["live"])
    nograd = (_rule("nograd_policy_seqs", 0.0) > 0) | live
    fwd_transient = pl.when(nograd).then(c("d_act_per_layer") + mm_buf + fold_fwd).otherwise(0.0)
    # Once per model (HF_FINAL_SBH, the attention mask) on top of features.memory's per-layer activations.
    b_rows = c("p_micro_batch").cast(pl.Float64) * grad_seqs
    # Gradient checkpointing re-materialises one layer during the backward, after the head's backward has freed its
    # buffers: the two transients do not coincide, the larger counts (features.memory adds the layer's to the
    # activations; here it moves to the head term as max(head, layer)).
    stored = c("d_act_per_layer") * c("d_layers_first") * c("d_inflight_microbatches")
    recompute_layer = (c("d_act_first") - stored).clip(lower_bound=0.0)
    act_first = stored + HF_FINAL_SBH * n_tok * h * ab + b_rows * s * s * ab
    head_bwd = pl.max_horizontal(head_bwd, recompute_layer)
    # Reference weights: the policy's dtype, sharded only where its preparation shards it.
    w_b = gathered_param_dtype_bytes()
    sharded = runtime_from_zero("reference_sharded_from_zero")
    ref_w = c("d_params_rank") * w_b / pl.when(sharded).then(c("p_dp").cast(pl.Float64)).otherwise(1.0)
    # What ZeRO-3 / FSDP keep gathered: the one rule per engine of features.memory (the generic rows' too); FSDP
    # gathers parameters in their own dtype (fp32 without mixed precision), not always 16-bit.
    gathered = (pl.when(runtime_is(lambda r: r.zero2_keeps_unsharded) & (c("p_zero") == 2)).then(c("d_params_rank") * w_b)
                .when(c("p_zero") >= 3).then(zero3_gathered_bytes(w_b)).otherwise(0.0))
    # FSDP's unsharded gradients kept over the Trainer's no_sync micro-batches (features.memory.fsdp_gathered).
    gathered = gathered + no_sync_grad_bytes()
    # Gradients: the HF Trainer frees them after every optimizer step (optimizer.zero_grad(), set_to_none), so with
    # one micro-batch per step they are allocated during the backward as the activations are freed: the peak holds
    # max(gradients, activations + the head's backward) on top of weights and optimizer state, not both. DeepSpeed
    # keeps its own gradient buffers (left as features.memory has them); with accumulation the gradients of the
    # earlier micro-batches are alive through the later ones.
    fresh = trl & fresh_grads_rows()
    params = c("d_params_rank").clip(lower_bound=1.0)
    grad_eff = fresh_grad_bpp(act_first + head_bwd)
    # DeepSpeed ZeRO 0-2 in fp32 (deepspeed 0.19.8; gradient bytes per parameter, d = data-parallel ranks). The
    # head's backward (the first op of the backward) runs before any gradient reaches a bucket; the step's transient
    # is the largest of three moments:
    # - the head's backward: activations + head, on top of what earlier micro-batches left (ga > 1: ZeRO-0/1 keep the
    #   full .grad until the boundary, :2294 stage 1 reduces only there; ZeRO-2 reduces into its partition at once);
    # - the layers' backward, activations being freed: ZeRO-0 autograd's .grad (4); ZeRO-1/2 each bucket (hidden^2
    #   elements with "auto", stage_1_and_2.py:1414-1466) lands in `grads_in_partition`, one partition-sized buffer
    #   (:2189-2194, 4/d), and ZeRO-1 keeps the other partitions' .grad until the step (:2270-2272: it copies only its
    #   own; :3102 frees the rest): 4 (1 - 1/d) more;
    # - the boundary / step, activations freed: ZeRO-0 flattens every gradient into one all-reduce bucket (engine.py
    #   :3095 buffered_allreduce_fallback with 5e8 elements per bucket, :3796 `self.flatten(bucket)`): 4 + 4;
    #   ZeRO-1/2 flatten the partition's gradients into a second partition-sized tensor (:3114-3117): 4/d + 4/d.
    # Measured: the step adds 8.0 B/param at world 1 with small activations, at every stage 0-2.
    ds = runtime_is(lambda r: r.own_grad_buffers)
    zero = c("p_zero")
    ds_grads = trl & ds & zero.is_in([0, 1, 2]) & fp32
    part = pl.when(zero == 0).then(4.0).otherwise(4.0 / c("p_dp").cast(pl.Float64))
    others = pl.when(zero == 1).then(4.0 - part).otherwise(0.0)
    held = pl.when(c("p_grad_accum") > 1).then(pl.when(zero == 2).then(part).otherwise(4.0)).otherwise(0.0)
    act_p, head_p = act_first / params, head_bwd / params
    grad_ds = (pl.max_horizontal(2.0 * part, held + act_p + head_p, others + part + act_p) - act_p - head_p).clip(
        lower_bound=0.0)
    return df.with_columns(
        d_act_first=pl.when(trl).then(act_first).otherwise(c("d_act_first")),
        d_grad_bpp=pl.when(fresh).then(grad_eff).when(ds_grads).then(grad_ds).otherwise(c("d_grad_bpp")),
        d_gathered_bytes=pl.when(trl).then(gathered).otherwise(c("d_gathered_bytes")),
        d_head_bwd_bytes=pl.when(trl).then(head_bwd).otherwise(None),
        # the step's fp32 gradient copies are in grad_ds already (features.memory.optimizer_step leaves them out)
        d_step_in_grads=ds_grads.fill_null(False),
        d_logits_bytes=pl.when(trl).then(head_bwd).otherwise(c("d_logits_bytes")),
        d_ref_weight_bytes=pl.when(trl).then(pl.when(live).then(ref_w).otherwise(0.0)).otherwise(
            c("d_ref_weight_bytes")),
        d_ref_transient_bytes=pl.when(trl).then((fwd_transient - head_bwd).clip(lower_bound=0.0)).otherwise(
            c("d_ref_transient_bytes")),
    )
