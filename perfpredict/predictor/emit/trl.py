"""DeepSpeed and FSDP plans both run a TRL (or transformers) script under accelerate launch, so their trainer
arguments, notes and accelerate settings are shared here."""

from __future__ import annotations

import json
from typing import Any

from perfpredict.core.frameworks import CAPABILITIES, runtime_of
from perfpredict.predictor.emit.common import RDZV_PORT, Ctx, comment_block, yaml_lines

# The trainer configs below carry only fields that exist in TRL 1.16.0's DPOConfig, experimental CPOConfig /
# ORPOConfig and KTOConfig (tests/test_trl_emit.py loads them in TRL).
TRL_VERSION = "1.16.0"

_TRL_REF_OFFLOAD_NOTE = [
    "reference 'offloaded': TRL's DPOTrainer has no flag to offload the reference model. Offloading the reference",
    "between forward passes is NeMo-Aligner style (cpu_weight_swap) or OpenRLHF style (train_dpo --ref_offload; its",
    "PPO script calls it --ref_reward_offload). TRL's equivalent is precompute_ref_log_probs: true, which computes the",
    "reference log-probs once before training and keeps the reference off the GPU afterwards.",
]


def trainer(ctx: Ctx) -> dict[str, Any]:
    """Which script runs the objective, the config class it parses, and the args file name (core.objectives)."""
    o = ctx.workload.spec
    return {"script": o.trl_script, "config": o.trl_config, "file": o.trl_args_file}


def _hf_gradient_checkpointing(ctx: Ctx) -> bool:
    # Under FSDP, activation checkpointing is accelerate's fsdp_activation_checkpointing; transformers raises if
    # TrainingArguments.gradient_checkpointing is also true.
    return ctx.plan.recompute != "none" and not runtime_of(ctx.plan.framework).accelerate_activation_checkpointing


def _trainer_args(ctx: Ctx) -> dict[str, Any]:
    """TrainingArguments / TRL config fields, in the consumers' names. Per-device batch counts pairs for preference
    objectives (TRL's per_device_train_batch_size counts pairs; chosen and rejected run as one concatenated batch)."""
    p, w = ctx.plan, ctx.workload
    gc = _hf_gradient_checkpointing(ctx)
    args: dict[str, Any] = {
        "output_dir": f"{ctx.model.name}-{w.objective}",
        "per_device_train_batch_size": p.micro_batch,
        "gradient_accumulation_steps": p.grad_accum,
    }
    if w.objective == "pretrain":
        args["block_size"] = w.seq_len  # run_clm.py's DataTrainingArguments
        args["do_train"] = True
    else:
        args["max_length"] = w.seq_len
    args["bf16"] = w.precision == "bf16"
    args["fp16"] = w.precision == "fp16"
    args["gradient_checkpointing"] = gc
    if gc:
        args["gradient_checkpointing_kwargs"] = {"use_reentrant": False}
    if p.fused_head:
        # TrainingArguments.use_liger_kernel (transformers >= 4.45) patches the model with Liger's kernels, whose
        # fused linear cross entropy is the head the plan's fused_head was composed with.
        args["use_liger_kernel"] = True
    o = w.spec
    if o.trl_trainer:
        if o.trl_loss_type:
            args["loss_type"] = o.trl_loss_type
        if o.trl_beta is not None:
            args["beta"] = o.trl_beta
        if o.needs_reference:
            args["precompute_ref_log_probs"] = w.reference == "precomputed"
        args.update(o.trl_extra_args)
    args["logging_steps"] = 10
    return args


def trainer_notes(ctx: Ctx) -> list[str]:
    w, t = ctx.workload, trainer(ctx)
    o = w.spec
    dpo_trainer = o.trl_trainer == "DPOTrainer"
    notes: list[str] = []
    if ctx.pref:
        notes.append(f"Trainer arguments ({t['config']}): {t['file']}; the torchrun target's launch.sh passes the "
                     "same values as flags" + (" (trl/scripts/dpo.py also takes it as --config)."
                                               if dpo_trainer else "."))
        notes.append(f"per_device_train_batch_size counts pairs: each GPU forwards {2 * ctx.plan.micro_batch} "
                     "sequences (chosen + rejected concatenated).")
    if dpo_trainer:
        notes.append(f"max_prompt_length is left out: TRL {TRL_VERSION}'s DPOConfig has none (max_length truncates "
                     "prompt + completion); filter overlong prompts from the dataset instead, or add it for an older "
                     "TRL.")
        if w.reference == "precomputed":
            notes.append("precompute_ref_log_probs: do not pass a ref_model; DPOTrainer then builds none and reads "
                         "the reference log-probs from the dataset (a reference passed anyway stays in memory).")
        if o.trl_beta_means:
            notes.append(f"loss_type {o.trl_loss_type}: beta is {o.trl_beta_means}.")
        if w.reference == "offloaded":
            notes += _TRL_REF_OFFLOAD_NOTE
    notes += o.trl_notes
    if o.trl_config.startswith("trl.experimental."):
        notes.append("CPO and ORPO live under trl.experimental in current TRL (trl.trainer in older releases).")
    if runtime_of(ctx.plan.framework).accelerate_activation_checkpointing and ctx.plan.recompute == "full":
        notes.append("recompute full is fsdp_activation_checkpointing in the accelerate config; gradient_checkpointing "
                     "stays false (transformers refuses both at once).")
    if runtime_of(ctx.plan.framework).no_sync_keeps_unsharded_grads and ctx.plan.grad_accum > 1:
        notes.append("gradient accumulation: the Trainer runs all but the last micro-batch in no_sync, so FSDP keeps "
                     "the whole model's unsharded gradients until the step's one reduce-scatter (the predicted peak "
                     "counts them); accelerator_config {\"gradient_accumulation_kwargs\": {\"sync_each_batch\": true}} "
                     "reduce-scatters every micro-batch instead (less memory, more communication than predicted).")
    return notes


def trl_args_file(ctx: Ctx) -> dict[str, str]:
    if not ctx.workload.spec.trl_args_file:
        return {}
    t = trainer(ctx)
    return {t["file"]: json.dumps(_trainer_args(ctx), indent=2) + "\n"}


def accelerate_common(ctx: Ctx) -> dict[str, Any]:
    c = ctx.cluster
    return {
        "machine_rank": 0,
        "main_process_port": RDZV_PORT,
        "main_training_function": "main",
        "num_machines": c.nodes,
        "num_processes": c.gpus,
        "rdzv_backend": "c10d" if c.nodes > 1 else "static",
        "same_network": True,
        "use_cpu": False,
    }


def accelerate_common_comments(ctx: Ctx) -> dict[str, list[str]]:
    return {
        "machine_rank": ["on each node pass --machine_rank $NODE_RANK --main_process_ip $MASTER_ADDR to accelerate "
                         "launch (the torchrun target's launch.sh does)"],
        "num_processes": [f"all GPUs: {ctx.cluster.nodes} node(s) x {ctx.cluster.gpus_per_node}"],
    }


def _cli_flags(args: dict[str, Any]) -> list[str]:
    """HfArgumentParser flags: bools as true/false values, dicts as JSON strings."""
    out: list[str] = []
    for k, v in args.items():
        if isinstance(v, bool):
            val = "true" if v else "false"
        elif isinstance(v, dict):
            val = json.dumps(v)
        else:
            val = str(v)
        out += [f"--{k}", val]
    return out


def accelerate_launch(ctx: Ctx, config_file: str) -> list[str]:
    t = trainer(ctx)
    cmd = ["accelerate", "launch", "--config_file", config_file,
           "--num_machines", str(ctx.cluster.nodes), "--num_processes", str(ctx.cluster.gpus),
           "--machine_rank", "$NODE_RANK", "--main_process_ip", "$MASTER_ADDR",
           "--main_process_port", str(RDZV_PORT)]
    if ctx.cluster.nodes > 1:
        cmd += ["--rdzv_backend", "c10d"]
    cmd += [t["script"], "--model_name_or_path", ctx.model_id, "--dataset_name", "$DATASET_NAME"]
    cmd += _cli_flags(_trainer_args(ctx))
    return cmd


def trl_files(ctx: Ctx) -> dict[str, str]:
    """The `trl` target: a TRL plan's trainer config and its accelerate files. trl+deepspeed and trl+fsdp plans get
    the deepspeed / fsdp target's files; plain trl plans an accelerate config for DDP (MULTI_GPU), or one process."""
    from perfpredict.predictor.emit.deepspeed import deepspeed_files
    from perfpredict.predictor.emit.fsdp import fsdp_files

    # trl+deepspeed / trl+fsdp: the files of their own emit target (the capability table's emit_target).
    backend = {"deepspeed": deepspeed_files, "fsdp": fsdp_files}.get(CAPABILITIES[ctx.plan.framework].emit_target)
    if backend:
        return backend(ctx)
    p, w = ctx.plan, ctx.workload
    mixed = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}[w.precision]
    cfg: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE", "debug": False,
                           "distributed_type": "MULTI_GPU" if ctx.cluster.gpus > 1 else "NO",
                           "downcast_bf16": "no", "mixed_precision": mixed}
    cfg.update(accelerate_common(ctx))
    comments = {"distributed_type": ["DistributedDataParallel over dp: every GPU holds the whole model, gradients "
                                     "all-reduced (no ZeRO)" if ctx.cluster.gpus > 1 else "one process"],
                **accelerate_common_comments(ctx)}
    notes = [f"TRL {TRL_VERSION} on accelerate, " + (f"DDP over dp {p.dp}" if p.dp > 1 else "one process")
             + f", micro batch {p.micro_batch} x grad accum {p.grad_accum}."]
    notes += trainer_notes(ctx)
    text = comment_block(ctx.header + [""] + notes) + "\n".join(yaml_lines(cfg, comments)) + "\n"
    return {"accelerate_config.yaml": text, **trl_args_file(ctx)}
