"""DeepSpeed target: ds_config.json plus the accelerate config that points at it."""

from __future__ import annotations

import json
from typing import Any

from perfpredict.core.frameworks import zero_optimization
from perfpredict.predictor.emit.common import Ctx, comment_block, yaml_lines
from perfpredict.predictor.emit.trl import accelerate_common, accelerate_common_comments, trainer_notes, trl_args_file


def _ds_config(ctx: Ctx) -> dict[str, Any]:
    p, w = ctx.plan, ctx.workload
    zero = zero_optimization(p.zero, optimizer_offload=p.optimizer_offload, param_offload=p.param_offload)
    if p.zero == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    fp16: dict[str, Any] = {"enabled": w.precision == "fp16"}
    if w.precision == "fp16":
        fp16.update({"loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000, "hysteresis": 2,
                     "min_loss_scale": 1})
    return {
        "_comment": f"{ctx.header[0]}; {ctx.header[1]}",
        "train_micro_batch_size_per_gpu": p.micro_batch,
        "gradient_accumulation_steps": p.grad_accum,
        "train_batch_size": p.micro_batch * p.grad_accum * p.dp,
        "gradient_clipping": "auto",
        "bf16": {"enabled": w.precision == "bf16"},
        "fp16": fp16,
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                  "weight_decay": "auto"}},
        "zero_optimization": zero,
        "steps_per_print": 100,
        "wall_clock_breakdown": False,
    }


def deepspeed_files(ctx: Ctx) -> dict[str, str]:
    p = ctx.plan
    ds = {"deepspeed_config_file": "ds_config.json"}
    if p.zero == 3:
        ds["zero3_init_flag"] = True
    cfg: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE", "debug": False, "deepspeed_config": ds,
                           "distributed_type": "DEEPSPEED", "downcast_bf16": "no"}
    cfg.update(accelerate_common(ctx))
    comments = {
        "deepspeed_config": [
            "ds_config.json owns precision, batch sizes, clipping and ZeRO settings: accelerate refuses",
            "mixed_precision, zero_stage, gradient_accumulation_steps, ... next to deepspeed_config_file.",
            "The path is relative to the directory you launch from (write_emitted puts the files side by side).",
        ],
        **accelerate_common_comments(ctx),
    }
    notes = [f"DeepSpeed ZeRO-{p.zero}" + (" with the optimizer offloaded to CPU" if p.optimizer_offload else "")
             + f", micro batch {p.micro_batch} x grad accum {p.grad_accum} x dp {p.dp}.",
             "ds_config.json uses \"auto\" where accelerate / the HF Trainer fill values (clipping, optimizer params,",
             "bucket sizes from hidden_size); batch sizes are explicit and must match the trainer's arguments."]
    if p.optimizer_offload:
        notes.append("The optimizer section makes DeepSpeed build its CPU Adam for the offloaded optimizer states.")
    notes += trainer_notes(ctx)
    text = comment_block(ctx.header + [""] + notes) + "\n".join(yaml_lines(cfg, comments)) + "\n"
    files = {"ds_config.json": json.dumps(_ds_config(ctx), indent=2) + "\n", "accelerate_config.yaml": text}
    files.update(trl_args_file(ctx))
    return files
