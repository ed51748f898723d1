"""Transformer shape: parameter counts and FLOPs per token derived from it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from perfpredict.core.errors import PerfPredictError, check_bool, check_int, check_str, require

# Upper bounds on each shape field (well beyond any model published), so arithmetic stays in range.
LIMITS = {"layers": 10_000, "hidden": 1 << 20, "heads": 1 << 16, "kv_heads": 1 << 16, "ffn": 1 << 22,
          "vocab": 1 << 24, "head_dim": 1 << 16, "experts": 1 << 16, "experts_per_token": 1 << 16,
          "expert_ffn": 1 << 22, "norms_per_layer": 16}
ZERO_OK = {"ffn", "head_dim", "experts", "experts_per_token", "expert_ffn", "norms_per_layer"}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    head_dim: int = 0  # 0 = hidden // heads
    tied_embeddings: bool = False
    gated_mlp: bool = True
    experts: int = 0  # 0 = dense
    experts_per_token: int = 0
    expert_ffn: int = 0
    qkv_bias: bool = False
    mlp_bias: bool = False
    norms_per_layer: int = 2
    # Soft-capped output logits, cap * tanh(logits / cap) (Gemma 2: config.json `final_logit_softcapping`); 0 = none.
    # transformers runs it on the full-vocabulary logits (features.memory.activations counts what autograd keeps).
    final_logit_softcapping: float = 0.0

    def __post_init__(self) -> None:
        check_str("model name", self.name)
        for f, hi in LIMITS.items():
            check_int(f"model {self.name!r}: {f}", getattr(self, f), 0 if f in ZERO_OK else 1, hi)
        for f in ("tied_embeddings", "gated_mlp", "qkv_bias", "mlp_bias"):
            check_bool(f"model {self.name!r}: {f}", getattr(self, f))
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        require(self.head_dim > 0, f"model {self.name!r}: head_dim must be positive (hidden {self.hidden} < heads "
                                   f"{self.heads}: give head_dim)")
        require(self.ffn > 0 or self.experts > 0, f"model {self.name!r}: ffn must be positive")
        require(self.heads % self.kv_heads == 0,
                f"model {self.name!r}: heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.experts:
            require(0 < self.experts_per_token <= self.experts,
                    f"model {self.name!r}: experts_per_token must be in 1..experts ({self.experts})")
            require(self.expert_ffn > 0, f"model {self.name!r}: expert_ffn must be positive for a MoE model")
        require(self.norms_per_layer >= 0, f"model {self.name!r}: norms_per_layer must be >= 0")
        cap = self.final_logit_softcapping
        require(isinstance(cap, (int, float)) and not isinstance(cap, bool) and 0.0 <= cap <= 1e6,
                f"model {self.name!r}: final_logit_softcapping must be a number >= 0 (0 = none), got {cap!r}")

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    # --- parameter counts -------------------------------------------------------------------
    @property
    def attn_params_per_layer(self) -> int:
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        bias = (q + 2 * kv) if self.qkv_bias else 0
        return self.hidden * (q + 2 * kv) + q * self.hidden + bias

    def _mlp(self, ffn: int) -> int:
        mats = 3 if self.gated_mlp else 2
        bias = (ffn * (mats - 1) + self.hidden) if self.mlp_bias else 0
        return mats * self.hidden * ffn + bias

    @property
    def mlp_params_per_layer(self) -> int:
        """All experts' parameters (what memory holds)."""
        if self.is_moe:
            return self.experts * self._mlp(self.expert_ffn) + self.hidden * self.experts
        return self._mlp(self.ffn)

    @property
    def active_mlp_params_per_layer(self) -> int:
        """Parameters one token passes through (what FLOPs see)."""
        if self.is_moe:
            return self.experts_per_token * self._mlp(self.expert_ffn) + self.hidden * self.experts
        return self._mlp(self.ffn)

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def layer_params(self) -> int:
        return self.attn_params_per_layer + self.mlp_params_per_layer + self.norms_per_layer * self.hidden

    @property
    def param_count(self) -> int:
        return self.layers * self.layer_params + self.embedding_params + self.hidden

    @property
    def active_param_count(self) -> int:
        per_layer = self.attn_params_per_layer + self.active_mlp_params_per_layer + self.norms_per_layer * self.hidden
        return self.layers * per_layer + self.embedding_params + self.hidden

    @property
    def matmul_params_per_token(self) -> int:
        """Weights a token multiplies through, the output head included, the embedding lookup not."""
        per_layer = self.attn_params_per_layer + self.active_mlp_params_per_layer
        return self.layers * per_layer + self.vocab * self.hidden

    def flops_per_token(self, seq_len: int, *, backward: bool = True, causal: bool = True) -> float:
        """Forward (2x) or forward+backward (6x) matmul FLOPs plus attention scores.

        Attention is 4*s*heads*head_dim per layer forward (QK^T and AV); causal masking halves the work
        a FlashAttention kernel does, which is what the published MFU numbers we compare with ignore, so
        callers choose."""
        mult = 3.0 if backward else 1.0
        attn = 4.0 * seq_len * self.heads * self.head_dim * self.layers * (0.5 if causal else 1.0)
        return mult * (2.0 * self.matmul_params_per_token + attn)

    # --- construction -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if not d["final_logit_softcapping"]:  # a later field: left out at its default so older dicts stay as they were
            del d["final_logit_softcapping"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, name: str | None = None) -> ModelSpec:
        if not isinstance(d, dict):
            raise PerfPredictError(f"model must be a catalog name, a config.json path or an object, got {d!r}")
        names = {f.name for f in fields(cls)}
        extra = set(d) - names - {"published_params", "source", "family", "hf_id", "notes", "active_params"}
        if extra:
            raise PerfPredictError(f"unknown model field(s) {sorted(extra)}; accepted: {sorted(names)}")
        kw = {k: v for k, v in d.items() if k in names}
        kw.setdefault("name", name or "custom")
        if "heads" in kw and "kv_heads" not in kw and not isinstance(kw["heads"], int):
            kw["kv_heads"] = 1  # the heads check reports the bad value
        kw.setdefault("kv_heads", kw.get("heads", 0))
        missing = {"layers", "hidden", "heads", "vocab"} - set(kw)
        if missing:
            raise PerfPredictError(f"model is missing field(s) {sorted(missing)}")
        try:
            return cls(**kw)
        except TypeError as e:
            raise PerfPredictError(f"bad model fields: {e}") from None
