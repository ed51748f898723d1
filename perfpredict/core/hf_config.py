"""Read a Hugging Face config.json into a ModelSpec (llama, mistral, mixtral, qwen2, granite, gemma, phi3, ...)."""

from __future__ import annotations

import json
from pathlib import Path

from perfpredict.core.errors import PerfPredictError
from perfpredict.core.model import ModelSpec

SUPPORTED = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "granite", "granitemoe", "gemma", "gemma2",
             "gemma3_text", "phi3", "olmo2", "deepseek")
# Ungated (GELU/ReLU) MLPs; everything else in SUPPORTED uses SwiGLU/GeGLU with gate, up and down projections.
_UNGATED = {"gpt2", "gpt_neox", "phi"}


def _first(cfg: dict, *keys: str, default=None):
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    return default


def model_from_hf_config(path: Path | str) -> ModelSpec:
    path = Path(path)
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:  # ValueError: bad JSON or not UTF-8
        raise PerfPredictError(f"cannot read model config {str(path)!r}: {str(e)[:200]}") from None
    try:
        return _from_config(cfg, path)
    except (TypeError, ValueError, ZeroDivisionError, AttributeError, OverflowError) as e:
        if isinstance(e, PerfPredictError):
            raise
        raise PerfPredictError(f"model config {str(path)!r} has a field of the wrong type or value "
                               f"({str(e)[:120]})") from None


def _from_config(cfg: object, path: Path) -> ModelSpec:
    if not isinstance(cfg, dict):
        raise PerfPredictError(f"model config {str(path)!r} is not a JSON object")
    cfg = cfg.get("text_config", cfg) if "hidden_size" not in cfg else cfg
    mtype = cfg.get("model_type", "")
    if mtype and mtype not in SUPPORTED and mtype not in _UNGATED:
        raise PerfPredictError(f"model_type {mtype!r} in {str(path)!r} is not supported; accepted: {', '.join(SUPPORTED)}")
    try:
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        layers = int(_first(cfg, "num_hidden_layers", "n_layer"))
        vocab = int(cfg["vocab_size"])
    except (KeyError, TypeError, ValueError) as e:
        raise PerfPredictError(f"model config {str(path)!r} lacks a required field ({e}); need hidden_size, "
                               "num_attention_heads, num_hidden_layers, vocab_size") from None
    experts = int(_first(cfg, "num_local_experts", "num_experts", default=0) or 0)
    ffn = int(_first(cfg, "intermediate_size", "ffn_hidden_size", default=4 * hidden))
    expert_ffn = int(_first(cfg, "moe_intermediate_size", default=ffn)) if experts else 0
    norms = 4 if mtype in ("gemma2", "gemma3_text") else 2
    return ModelSpec(
        name=str(_first(cfg, "_name_or_path", default=path.parent.name or "custom")) or "custom",
        layers=layers, hidden=hidden, heads=heads,
        kv_heads=int(_first(cfg, "num_key_value_heads", default=heads)),
        head_dim=int(_first(cfg, "head_dim", default=hidden // heads)),
        ffn=ffn if not experts else ffn, vocab=vocab,
        tied_embeddings=bool(cfg.get("tie_word_embeddings", mtype.startswith("gemma"))),
        gated_mlp=mtype not in _UNGATED,
        experts=experts,
        experts_per_token=int(_first(cfg, "num_experts_per_tok", "num_experts_per_token", default=0) or 0),
        expert_ffn=expert_ffn,
        qkv_bias=bool(cfg.get("attention_bias", mtype in ("qwen2", "qwen2_moe"))),
        norms_per_layer=norms,
        # Gemma 2's config.json (null where a model turns it off, absent on models without it)
        final_logit_softcapping=float(cfg.get("final_logit_softcapping") or 0.0),
    )
