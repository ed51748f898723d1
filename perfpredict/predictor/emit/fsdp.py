"""FSDP target: accelerate's FSDP2 config, with the layer class that auto-wrap needs."""

from __future__ import annotations

from typing import Any

from perfpredict.core.model import ModelSpec
from perfpredict.predictor.emit.common import Ctx, comment_block, yaml_lines
from perfpredict.predictor.emit.trl import accelerate_common, accelerate_common_comments, trainer_notes, trl_args_file

# Hugging Face decoder-layer classes for the catalog families (FSDP auto-wrap). Unknown models fall back to
# accelerate's default, the model's `_no_split_modules`.
_HF_DECODER_LAYER = {
    "llama": "LlamaDecoderLayer",
    "qwen2": "Qwen2DecoderLayer",
    "mistral": "MistralDecoderLayer",
    "mixtral": "MixtralDecoderLayer",
    "gemma2": "Gemma2DecoderLayer",
    "granite": "GraniteDecoderLayer",
    "phi3": "Phi3DecoderLayer",
}


def _decoder_layer_class(model: ModelSpec) -> str | None:
    from perfpredict.core.catalog import model_catalog_raw

    name = model.name.lower()
    if "mixtral" in name:
        return _HF_DECODER_LAYER["mixtral"]
    family = (model_catalog_raw().get(model.name) or {}).get("family", "")
    return _HF_DECODER_LAYER.get(family)


def fsdp_files(ctx: Ctx) -> dict[str, str]:
    p, w = ctx.plan, ctx.workload
    fsdp: dict[str, Any] = {
        "fsdp_version": 2,
        "fsdp_reshard_after_forward": p.zero == 3,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
    }
    layer_cls = _decoder_layer_class(ctx.model)
    if layer_cls:
        fsdp["fsdp_transformer_layer_cls_to_wrap"] = layer_cls
    fsdp.update({
        "fsdp_offload_params": p.optimizer_offload,
        "fsdp_activation_checkpointing": p.recompute == "full",
        "fsdp_cpu_ram_efficient_loading": True,
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
    })
    mixed = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}[w.precision]
    cfg: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE", "debug": False, "distributed_type": "FSDP",
                           "downcast_bf16": "no", "fsdp_config": fsdp, "mixed_precision": mixed}
    cfg.update(accelerate_common(ctx))
    strategy = "FULL_SHARD" if p.zero == 3 else "SHARD_GRAD_OP"
    comments = {
        "fsdp_config.fsdp_version": ["FSDP2 (fully_shard). On FSDP1 (fsdp_version: 1) replace fsdp_reshard_after_forward",
                                     f"with fsdp_sharding_strategy: {strategy}."],
        "fsdp_config.fsdp_reshard_after_forward": [f"true = FULL_SHARD (ZeRO-3), false = SHARD_GRAD_OP (ZeRO-2); "
                                                   f"this plan: {strategy} (zero {p.zero})"],
        "fsdp_config.fsdp_offload_params": ["FSDP offloads parameters, gradients and optimizer states to CPU together "
                                            "(there is no optimizer-only offload)" if p.optimizer_offload else
                                            "no CPU offload (FSDP would offload parameters, gradients and optimizer "
                                            "states together)"],
        "fsdp_config.fsdp_activation_checkpointing": [f"plan recompute: {p.recompute}"],
        **accelerate_common_comments(ctx),
    }
    if not layer_cls:
        comments["fsdp_config.fsdp_auto_wrap_policy"] = [
            "no fsdp_transformer_layer_cls_to_wrap: accelerate wraps the model's _no_split_modules "
            "(its decoder-layer class)"]
    notes = [f"FSDP {strategy} over dp {p.dp}, micro batch {p.micro_batch} x grad accum {p.grad_accum}."]
    notes += trainer_notes(ctx)
    text = comment_block(ctx.header + [""] + notes) + "\n".join(yaml_lines(cfg, comments)) + "\n"
    files = {"accelerate_fsdp.yaml": text}
    files.update(trl_args_file(ctx))
    return files
