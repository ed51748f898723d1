"""Megatron target: Megatron-LM arguments, plus the NeMo-Aligner overrides that run preference objectives."""

from __future__ import annotations

import shlex

from perfpredict.predictor.emit.common import Ctx, comment_block


def _megatron_arg_lines(ctx: Ctx) -> list[tuple[list[str], str | None]]:
    """(tokens, comment) per line of megatron_args.txt."""
    m, p, w = ctx.model, ctx.plan, ctx.workload
    seqs = w.seqs_per_sample
    lines: list[tuple[list[str], str | None]] = [
        (["--tensor-model-parallel-size", str(p.tp)], None),
        (["--pipeline-model-parallel-size", str(p.pp)], None),
        (["--context-parallel-size", str(p.cp)], None),
    ]
    if p.stage_layers:
        lines.append((["--decoder-first-pipeline-num-layers", str(p.stage_layers[0]),
                       "--decoder-last-pipeline-num-layers", str(p.stage_layers[-1])],
                      f"uneven stages {list(p.stage_layers)}: the middle stages split the rest evenly"))
    if p.ep > 1:
        lines.append((["--expert-model-parallel-size", str(p.ep)], "experts sharded over ep ranks of dp"))
    if p.schedule == "interleaved" and p.virtual_stages > 1:
        if p.stage_layers:  # with first/last counts given Megatron takes the virtual stage count instead
            lines.append((["--num-virtual-stages-per-pipeline-rank", str(p.virtual_stages)],
                          f"interleaved 1F1B, {p.virtual_stages} virtual stages per pipeline rank"))
        else:
            lines.append((["--num-layers-per-virtual-pipeline-stage", str(m.layers // (p.pp * p.virtual_stages))],
                          f"interleaved 1F1B, {p.virtual_stages} virtual stages per pipeline rank"))
    if p.sequence_parallel:
        lines.append((["--sequence-parallel"], None))
    if p.zero >= 1:
        lines.append((["--use-distributed-optimizer"], "shards optimizer state over dp (ZeRO-1)"))
    if p.zero >= 2:
        strategy = "optim_grads" if p.zero == 2 else "optim_grads_params"
        lines.append((["--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy,
                       "--no-gradient-accumulation-fusion"], f"ZeRO-{p.zero} through Megatron-FSDP"))
    if p.optimizer_offload:
        lines.append((["--optimizer-cpu-offload", "--optimizer-offload-fraction", "1.0",
                       "--overlap-cpu-optimizer-d2h-h2d", "--use-precision-aware-optimizer"],
                      "optimizer states and step on CPU"))
    if p.recompute == "selective":
        lines.append((["--recompute-granularity", "selective"], None))
    elif p.recompute == "full":
        lines.append((["--recompute-granularity", "full", "--recompute-method", "uniform",
                       "--recompute-num-layers", "1"], None))
    batch_note = None
    if ctx.pref:
        batch_note = (f"sequences: {p.micro_batch} pair(s) x 2 per micro batch, {w.global_batch} pairs x 2 per step. "
                      "NeMo-Aligner counts pairs instead: model.micro_batch_size="
                      f"{p.micro_batch}, model.global_batch_size={w.global_batch} (it forwards 2 x micro_batch_size)")
    lines += [
        (["--micro-batch-size", str(p.micro_batch * seqs)], batch_note),
        (["--global-batch-size", str(w.global_batch * seqs)], None),
        (["--seq-length", str(w.seq_len)], None),
        (["--max-position-embeddings", str(w.seq_len)], None),
    ]
    if w.precision in ("bf16", "fp16"):
        lines.append(([f"--{w.precision}"], None))
    # model shape
    lines += [
        (["--num-layers", str(m.layers)], f"model shape: {m.name}"),
        (["--hidden-size", str(m.hidden)], None),
        (["--num-attention-heads", str(m.heads)], None),
    ]
    if m.kv_heads != m.heads:
        lines.append((["--group-query-attention", "--num-query-groups", str(m.kv_heads)], None))
    if m.heads * m.head_dim != m.hidden:
        lines.append((["--kv-channels", str(m.head_dim)], None))
    ffn = m.ffn or m.expert_ffn
    lines.append((["--ffn-hidden-size", str(ffn)], None))
    if m.is_moe:
        lines.append((["--num-experts", str(m.experts), "--moe-router-topk", str(m.experts_per_token),
                       "--moe-ffn-hidden-size", str(m.expert_ffn)], None))
    if m.gated_mlp:
        note = "Megatron's --swiglu is SiLU-gated; Gemma's GeGLU needs a custom activation" \
            if "gemma" in m.name.lower() else None
        lines.append((["--swiglu"], note))
    if not m.tied_embeddings:
        lines.append((["--untie-embeddings-and-output-weights"], None))
    if not m.mlp_bias:
        lines.append((["--disable-bias-linear"], None))
    if m.qkv_bias:
        lines.append((["--add-qkv-bias"], None))
    lines += [
        (["--normalization", "RMSNorm" if m.gated_mlp else "LayerNorm"], None),
        (["--position-embedding-type", "rope"], None),
        (["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", ctx.model_id], None),
    ]
    return lines


def megatron_tokens(ctx: Ctx) -> list[str]:
    return [t for toks, _ in _megatron_arg_lines(ctx) for t in toks]


def _megatron_notes(ctx: Ctx) -> list[str]:
    w = ctx.workload
    notes = ["Megatron-LM arguments for pretrain_gpt.py; add data (--data-path or --mock-data), --lr, --train-iters",
             "and --save/--load for your run."]
    if ctx.pref:
        notes += [
            "Preference objective: batch sizes above count sequences (2 per pair, chosen + rejected).",
            "NeMo-Aligner (Megatron DPO trainer) counts model.micro_batch_size and model.global_batch_size in pairs",
            "and forwards 2 x micro_batch_size sequences. Its DPO keys: model.dpo.ref_policy_kl_penalty (beta),",
            "model.dpo.preference_loss (dpo | ipo | rpo_sq | rpo_bwd_kl | rpo_fwd_kl), model.dpo.preference_average_log_probs,",
            "model.dpo.sft_loss_weight, model.dpo.preference_loss_weight, model.dpo.log_prob_forward_micro_batch_size.",
            "NeMo-Aligner keeps the reference weights on CPU and swaps them in to score each global batch "
            "(cpu_weight_swap).",
        ]
        if w.spec.nemo_aligner_loss is None:
            notes.append(f"NeMo-Aligner has no {w.objective} loss: these arguments give the parallel layout for a "
                         "custom Megatron trainer.")
    return notes


def megatron_files(ctx: Ctx) -> dict[str, str]:
    body = []
    for toks, comment in _megatron_arg_lines(ctx):
        if comment:
            body.append(f"# {comment}")
        body.append(" ".join(shlex.quote(t) for t in toks))
    text = comment_block(ctx.header + [""] + _megatron_notes(ctx)) + "\n".join(body) + "\n"
    files = {"megatron_args.txt": text}
    if ctx.pref:  # the trainer that runs preference objectives on Megatron (core.frameworks Trainer rows)
        files["nemo_aligner_overrides.txt"] = (
            comment_block(ctx.header + ["", "NeMo-Aligner Hydra overrides for examples/nlp/gpt/train_gpt_dpo.py "
                                        "(the trainer that runs this objective on Megatron; launch.sh of target "
                                        "torchrun runs it)."])
            + "\n".join(nemo_aligner_overrides(ctx)) + "\n")
    return files


def nemo_aligner_overrides(ctx: Ctx) -> list[str]:
    p, w = ctx.plan, ctx.workload
    precision = {"bf16": "bf16", "fp16": "16", "fp32": "32"}[w.precision]
    out = [
        f"trainer.num_nodes={ctx.cluster.nodes}",
        f"trainer.devices={ctx.cluster.gpus_per_node}",
        f"trainer.precision={precision}",
        "pretrained_checkpoint.restore_from_path=$NEMO_CHECKPOINT",
        "model.data.data_prefix={train: [$TRAIN_DATA], validation: [$VALID_DATA], test: [$VALID_DATA]}",
        f"++model.tensor_model_parallel_size={p.tp}",
        f"++model.pipeline_model_parallel_size={p.pp}",
        f"++model.context_parallel_size={p.cp}",
        f"++model.sequence_parallel={'true' if p.sequence_parallel else 'false'}",
    ]
    if p.schedule == "interleaved" and p.virtual_stages > 1:
        out.append(f"++model.virtual_pipeline_model_parallel_size={p.virtual_stages}")
    if p.ep > 1:
        out.append(f"++model.expert_model_parallel_size={p.ep}")
    if p.stage_layers:  # Megatron-core TransformerConfig's names for --decoder-first/last-pipeline-num-layers
        out += [f"++model.num_layers_in_first_pipeline_stage={p.stage_layers[0]}",
                f"++model.num_layers_in_last_pipeline_stage={p.stage_layers[-1]}"]
    out += [
        f"++model.micro_batch_size={p.micro_batch}",
        f"++model.global_batch_size={w.global_batch}",
        f"++model.data.seq_length={w.seq_len}",
        f"++model.optim.name={'distributed_fused_adam' if p.zero >= 1 else 'fused_adam'}",
    ]
    if p.recompute == "selective":
        out.append("++model.activations_checkpoint_granularity=selective")
    elif p.recompute == "full":
        out += ["++model.activations_checkpoint_granularity=full", "++model.activations_checkpoint_method=uniform",
                "++model.activations_checkpoint_num_layers=1"]
    out += [f"++model.dpo.preference_loss={w.spec.nemo_aligner_loss}", "++model.dpo.ref_policy_kl_penalty=0.1"]
    return out
