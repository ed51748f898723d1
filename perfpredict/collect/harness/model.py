"""A Llama-style decoder in plain torch, sized from a ModelSpec, with random weights (no downloads).

Pieces: RMSNorm, RoPE (computed on the fly: cheap, and no buffer to thread through TP/PP), GQA attention through
F.scaled_dot_product_attention (causal), SwiGLU (or GELU when the spec is not gated), and an optional MoE layer
with top-k routing. Layers live in an nn.ModuleDict keyed "0".."L-1" so a pipeline stage can delete the ones it
does not own and keep the original names. Every projection is an nn.Linear named wq/wk/wv/wo and w1/w2/w3 so the
tensor-parallel plans in parallel.py can address them by name.

`shrink(spec, ...)` scales a catalog model down to what a CPU step can run in seconds, keeping the ratios that
shape the work: heads per kv head (GQA group), ffn/hidden, expert_ffn/hidden, vocab/hidden, experts and top-k."""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from perfpredict.core.model import ModelSpec


def _round_to(x: float, multiple: int, minimum: int) -> int:
    return max(minimum, int(round(x / multiple)) * multiple)


def shrink(spec: ModelSpec, *, hidden: int | None = None, layers: int | None = None, vocab: int | None = None,
           min_kv_heads: int = 2, multiple: int = 16) -> ModelSpec:
    """A smaller model of the same family.

    Width: hidden -> `hidden`; ffn, expert_ffn and (unless given) vocab scale by the same factor, rounded to
    `multiple` (so tp = 1, 2, 4 divide them). Heads: the GQA group (heads/kv_heads) is kept; kv_heads scales with
    the width but stays >= min_kv_heads (so TP over 2 ranks can split them), and head_dim = q-width/heads, even
    (RoPE rotates pairs). Depth: `layers`. Experts and top-k are kept: they set the routing pattern."""
    if hidden is None and layers is None and vocab is None:
        return spec
    h = hidden or spec.hidden
    f = h / spec.hidden
    group = spec.heads // spec.kv_heads
    kv = max(min_kv_heads, int(round(spec.kv_heads * f)))
    kv = min(kv, spec.kv_heads) if spec.kv_heads >= min_kv_heads else kv
    heads = kv * group
    q_width = spec.heads * spec.head_dim * f
    head_dim = max(8, int(q_width // heads) // 2 * 2)
    ffn = _round_to(spec.ffn * f, multiple, multiple) if spec.ffn else 0
    expert_ffn = _round_to(spec.expert_ffn * f, multiple, multiple) if spec.experts else 0
    v = vocab or _round_to(spec.vocab * f, 64, 256)
    name = f"{spec.name}@L{layers or spec.layers}-H{h}"
    return dataclasses.replace(spec, name=name, layers=layers or spec.layers, hidden=h, heads=heads, kv_heads=kv,
                               head_dim=head_dim, ffn=ffn, expert_ffn=expert_ffn, vocab=v)


# --- modules ----------------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 as HF Llama does; the output returns to the input dtype.
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope(x: torch.Tensor, base: float = 500000.0) -> torch.Tensor:
    """Rotate-half RoPE on (B, T, heads, head_dim)."""
    T, hd = x.shape[1], x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd))
    ang = torch.outer(torch.arange(T, device=x.device, dtype=torch.float32), inv)  # (T, hd/2)
    cos = torch.cat([ang.cos(), ang.cos()], -1)[None, :, None, :].to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], -1)[None, :, None, :].to(x.dtype)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.head_dim = spec.head_dim
        q, kv = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
        self.wq = nn.Linear(spec.hidden, q, bias=spec.qkv_bias)
        self.wk = nn.Linear(spec.hidden, kv, bias=spec.qkv_bias)
        self.wv = nn.Linear(spec.hidden, kv, bias=spec.qkv_bias)
        self.wo = nn.Linear(q, spec.hidden, bias=False)
        self.recompute_core = False  # selective recompute: rerun RoPE + SDPA in backward (Megatron's "core attn")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T = x.shape[0], x.shape[1]
        # -1 heads: under TP a rank holds heads/tp query and kv_heads/tp kv heads of the projections.
        q = self.wq(x).view(B, T, -1, self.head_dim)
        k = self.wk(x).view(B, T, -1, self.head_dim)
        v = self.wv(x).view(B, T, -1, self.head_dim)
        if self.recompute_core and torch.is_grad_enabled():
            out = checkpoint(self._core, q, k, v, use_reentrant=False)
        else:
            out = self._core(q, k, v)
        return self.wo(out)

    @staticmethod
    def _core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        B, T = q.shape[0], q.shape[1]
        q, k = rope(q), rope(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
        return out.transpose(1, 2).reshape(B, T, -1)


class MLP(nn.Module):
    def __init__(self, hidden: int, ffn: int, *, gated: bool, bias: bool) -> None:
        super().__init__()
        self.gated = gated
        self.w1 = nn.Linear(hidden, ffn, bias=bias)
        self.w2 = nn.Linear(ffn, hidden, bias=bias)
        self.w3 = nn.Linear(hidden, ffn, bias=bias) if gated else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x)))


class MoE(nn.Module):
    """Top-k routed experts (Mixtral-style: softmax over experts, top-k, renormalised weights).

    Every expert runs every step, on an empty slice if no token picked it: DDP then sees a gradient for every
    parameter, and under TP all ranks (same tokens, same routing) issue the same collectives."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.top_k = spec.experts_per_token
        self.router = nn.Linear(spec.hidden, spec.experts, bias=False)
        self.experts = nn.ModuleList(MLP(spec.hidden, spec.expert_ffn, gated=spec.gated_mlp, bias=spec.mlp_bias)
                                     for _ in range(spec.experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        xf = x.reshape(-1, shape[-1])
        probs = torch.softmax(self.router(xf).float(), dim=-1)
        w, idx = torch.topk(probs, self.top_k, dim=-1)
        w = (w / w.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(xf)
        for e, expert in enumerate(self.experts):
            tok, slot = torch.where(idx == e)
            out = out.index_add(0, tok, expert(xf[tok]) * w[tok, slot].unsqueeze(-1))
        return out.view(shape)


class Block(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(spec.hidden)
        self.attention = Attention(spec)
        self.ffn_norm = RMSNorm(spec.hidden)
        self.feed_forward = MoE(spec) if spec.is_moe else MLP(spec.hidden, spec.ffn, gated=spec.gated_mlp,
                                                                   bias=spec.mlp_bias)
        # Gemma-2 style sandwich norms (norms_per_layer = 4): normalise each sublayer's output before the residual.
        sandwich = spec.norms_per_layer >= 4
        self.post_attention_norm = RMSNorm(spec.hidden) if sandwich else None
        self.post_ffn_norm = RMSNorm(spec.hidden) if sandwich else None
        self.recompute_full = False

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.attention(self.attention_norm(x))
        if self.post_attention_norm is not None:
            a = self.post_attention_norm(a)
        h = x + a
        f = self.feed_forward(self.ffn_norm(h))
        if self.post_ffn_norm is not None:
            f = self.post_ffn_norm(f)
        return h + f

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute_full and torch.is_grad_enabled():
            return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)


class Decoder(nn.Module):
    """Embedding -> blocks -> norm -> head. Any of embedding / norm / head may be None on a pipeline stage."""

    def __init__(self, spec: ModelSpec, *, tie: bool = True) -> None:
        super().__init__()
        self.spec = spec
        self.tok_embeddings: nn.Module | None = nn.Embedding(spec.vocab, spec.hidden)
        self.layers = nn.ModuleDict({str(i): Block(spec) for i in range(spec.layers)})
        self.norm: nn.Module | None = RMSNorm(spec.hidden)
        self.output: nn.Module | None = nn.Linear(spec.hidden, spec.vocab, bias=False)
        if tie and spec.tied_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        for layer in self.layers.values():
            h = layer(h)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h

    def set_recompute(self, mode: str) -> None:
        for b in self.layers.values():
            b.recompute_full = mode == "full"
            b.attention.recompute_core = mode == "selective"


def init_weights(model: nn.Module, *, seed: int) -> None:
    """Deterministic N(0, 0.02) weights (GPT-2 style), scaled down on the residual outputs; norms at 1."""
    g = torch.Generator().manual_seed(seed)
    n_layers = max(1, len(getattr(model, "layers", [])))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                std = 0.02 / math.sqrt(2 * n_layers) if name.endswith(("wo.weight", "w2.weight")) else 0.02
                p.copy_(torch.randn(p.shape, generator=g) * std)


def build_model(spec: ModelSpec, *, seed: int = 0, tie: bool = True, dtype: torch.dtype = torch.float32,
                device: torch.device | str = "cpu", recompute: str = "none") -> Decoder:
    """Built on CPU in fp32 from a fixed seed, so every rank (and a single process) starts from the same weights;
    then moved. The same seed and spec always give the same model whatever the plan."""
    m = Decoder(spec, tie=tie)
    init_weights(m, seed=seed)
    m.set_recompute(recompute)
    return m.to(device=device, dtype=dtype)
