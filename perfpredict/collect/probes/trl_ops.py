"""TRL-op probes (`collect probes --families trl`): the ops transformers' Llama and TRL's fused head really run in a
TRL preference step, timed beside the generic kernel probes, so each host's TRL efficiency is measured rather than
fitted (models.trl_scales reads the ratio of each probe to the generic kernel models' time for the same work).

Read from the installed sources (transformers 5.24.0, TRL 1.16.0, site-packages paths):
- trl_sdpa: integrations/sdpa_attention.py:94-200 `sdpa_attention_forward`. With a padding mask (DPO left-pads the
  prompts and right-pads the completions, so a batch with unequal lengths has one) `use_gqa_in_sdpa` (:42-51) is
  False and K/V are repeated to every head (`repeat_kv`, :19 and :124-125), then SDPA runs with `attn_mask` = the
  4-D [b, 1, s, s] mask of masking_utils.py:395 `sdpa_mask` (boolean in 5.24; the float one is `eager_mask`'s,
  :552-617) and `is_causal=False` (:148). The generic probe runs `is_causal=True` with `enable_gqa`.
- trl_linears: the layer's seven nn.Linear (q, k, v, o, gate, up, down; modeling_llama.py:164 for the MLP), each
  `x @ W.T` with W stored [out, in], forward and autograd's backward. The composition counts four GEMMs (qkv fused,
  gate+up fused) of the same work.
- trl_elementwise: the layer's eager elementwise ops: two LlamaRMSNorm (modeling_llama.py:53-68: upcast, pow, mean,
  rsqrt, two products), rotary on q and k (:119-149 `rotate_half` = slice + cat, `apply_rotary_pos_emb`), the
  SiLU-gated product, two residual adds; forward and backward. The composition times norms, SwiGLU and the adds
  only (rotary costs a launch there).
- trl_head: trl/kernels/chunked_logprob.py:299-440 `ChunkedLogProbFunction` itself, called as
  trl/trainer/utils.py:1644 calls it (every position scored without Triton, outputs as DPOTrainer requests them,
  dpo_trainer.py:957), forward and backward: the head's tile GEMMs and its torch fold of each tile.

All in fp32 (every TRL row we hold ran fp32; collect trl's dtype) on one thread, as a rank runs. Shapes: the TRL
grid's model shapes (collect.trl_shapes.SHAPES) at a few (rows, sequence) points, 2 rows per sample (chosen and
rejected). A failed probe (e.g. TRL not installed for trl_head) is a row with its outcome."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

# The ops these probes write are core.schema.TRL_OPS (not imported: this module runs where polars is absent).

# (sequences per micro-batch, padded sequence length) per shape: the TRL grid's range (collect.trl.grid: batch 1-8
# samples of 2 sequences, 128-1024 tokens), a short and a long point.
POINTS = ((2, 256), (4, 512))
QUICK_POINTS = ((2, 128),)
# The head probe's token count is capped so one call stays under HEAD_MAX_FLOPS (its four tile GEMMs): the largest
# grid shapes would take seconds per call; the fold's cost per logit does not depend on the token count.
HEAD_MAX_FLOPS = 8e9
PAD_SHARE = 0.125  # share of each row's positions left-padded (masked), so the mask is not all ones


def _padding_mask(rows: int, s: int, device: torch.device) -> torch.Tensor:
    """The [rows, 1, s, s] boolean mask sdpa_mask builds for a left-padded causal batch (True: attend)."""
    pos = torch.arange(s, device=device)
    causal = pos[None, :] <= pos[:, None]
    pad = torch.zeros(rows, s, dtype=torch.bool, device=device)
    for r in range(rows):
        pad[r, : int(s * PAD_SHARE * (r % 2))] = True  # every other row padded, as unequal lengths give
    keep = causal[None, :, :] & ~pad[:, None, :]
    keep |= torch.eye(s, dtype=torch.bool, device=device)[None]  # padded queries see themselves (no NaN rows)
    return keep[:, None, :, :]


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    # transformers integrations/sdpa_attention.py:19 repeat_kv: expand + reshape (a copy).
    b, kv, s, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)


def sdpa_fns(rows: int, heads: int, kv_heads: int, s: int, d: int, device: torch.device,
             dtype: torch.dtype) -> tuple[Callable[[], object], Callable[[], object]]:
    q = torch.randn(rows, heads, s, d, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(rows, kv_heads, s, d, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(rows, kv_heads, s, d, device=device, dtype=dtype, requires_grad=True)
    go = torch.randn(rows, heads, s, d, device=device, dtype=dtype)
    mask = _padding_mask(rows, s, device)
    rep = heads // kv_heads

    def run() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, _repeat_kv(k, rep), _repeat_kv(v, rep), attn_mask=mask,
                                              is_causal=False, scale=d ** -0.5)

    def fwd() -> torch.Tensor:
        with torch.no_grad():
            return run()

    def fwd_bwd() -> None:
        torch.autograd.grad(run(), (q, k, v), go)

    return fwd, fwd_bwd


def linears_fn(tokens: int, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int, device: torch.device,
               dtype: torch.dtype) -> tuple[Callable[[], object], Callable[[], object]]:
    shapes = [(heads * head_dim, hidden), (kv_heads * head_dim, hidden), (kv_heads * head_dim, hidden),
              (hidden, heads * head_dim), (ffn, hidden), (ffn, hidden), (hidden, ffn)]  # q k v o gate up down
    ws = [torch.randn(o, i, device=device, dtype=dtype, requires_grad=True) for o, i in shapes]
    xs = [torch.randn(tokens, i, device=device, dtype=dtype, requires_grad=True) for _, i in shapes]
    gos = [torch.randn(tokens, o, device=device, dtype=dtype) for o, _ in shapes]

    def fwd() -> None:
        with torch.no_grad():
            for w, x in zip(ws, xs, strict=True):
                F.linear(x, w)

    def fwd_bwd() -> None:
        for w, x, go in zip(ws, xs, gos, strict=True):
            torch.autograd.grad(F.linear(x, w), (x, w), go)

    return fwd, fwd_bwd


def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # transformers models/llama/modeling_llama.py:63-68 LlamaRMSNorm.forward
    dt = x.dtype
    h = x.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + 1e-6)
    return w * h.to(dt)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def elementwise_fn(rows: int, s: int, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int,
                   device: torch.device, dtype: torch.dtype) -> tuple[Callable[[], object], Callable[[], object]]:
    tokens = rows * s
    x = torch.randn(rows, s, hidden, device=device, dtype=dtype, requires_grad=True)
    attn = torch.randn(rows, s, hidden, device=device, dtype=dtype, requires_grad=True)
    mlp = torch.randn(rows, s, hidden, device=device, dtype=dtype, requires_grad=True)
    w1 = torch.ones(hidden, device=device, dtype=dtype, requires_grad=True)
    w2 = torch.ones(hidden, device=device, dtype=dtype, requires_grad=True)
    q = torch.randn(rows, heads, s, head_dim, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(rows, kv_heads, s, head_dim, device=device, dtype=dtype, requires_grad=True)
    cos = torch.randn(rows, 1, s, head_dim, device=device, dtype=dtype)
    sin = torch.randn(rows, 1, s, head_dim, device=device, dtype=dtype)
    gate = torch.randn(tokens, ffn, device=device, dtype=dtype, requires_grad=True)
    up = torch.randn(tokens, ffn, device=device, dtype=dtype, requires_grad=True)
    leaves = (x, attn, mlp, w1, w2, q, k, gate, up)

    def layer() -> list[torch.Tensor]:
        n1 = _rms(x, w1)
        qe = q * cos + _rotate_half(q) * sin  # modeling_llama.py:147-148
        ke = k * cos + _rotate_half(k) * sin
        h = x + attn  # residual after attention
        n2 = _rms(h, w2)
        act = F.silu(gate) * up  # modeling_llama.py:164, act_fn = SiLU
        out = h + mlp  # residual after the MLP
        return [n1, qe, ke, n2, act, out]

    def fwd() -> None:
        with torch.no_grad():
            layer()

    def fwd_bwd() -> None:
        outs = layer()
        torch.autograd.grad(outs, leaves, [torch.ones_like(o) for o in outs])

    return fwd, fwd_bwd


def head_fn(tokens: int, hidden: int, vocab: int, device: torch.device,
            dtype: torch.dtype) -> tuple[Callable[[], object], Callable[[], object]]:
    """TRL's own fused head: a no-grad forward (a live reference's) and the policy's forward and backward (ImportError if TRL is absent: the probe's failed row)."""
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction  # noqa: PLC0415 - optional dependency
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE  # noqa: PLC0415

    h = torch.randn(tokens, hidden, device=device, dtype=dtype, requires_grad=True)
    w = torch.randn(vocab, hidden, device=device, dtype=dtype, requires_grad=True)
    tgt = torch.randint(0, vocab, (tokens,), device=device)
    outputs = ("log_probs", "entropy", "mean_logits", "is_top1")  # trl/trainer/dpo_trainer.py:957

    def run() -> torch.Tensor:
        return ChunkedLogProbFunction.apply(h, w, None, tgt, 1.0, _CHUNKED_LOGPROB_CHUNK_SIZE, None, 1.0, outputs)[0]

    def fwd() -> None:
        with torch.no_grad():
            run()

    def fwd_bwd() -> None:
        torch.autograd.grad(run().sum(), (h, w))

    return fwd, fwd_bwd


def trl_op_configs(quick: bool) -> list[dict[str, int]]:
    """One dict per (shape, point): the model dimensions and the batch the probes run."""
    from perfpredict.collect.trl_shapes import SHAPES

    out = []
    for spec in SHAPES.values():
        for rows, s in (QUICK_POINTS if quick else POINTS):
            out.append(dict(hidden=spec.hidden, heads=spec.heads, kv_heads=spec.kv_heads,
                            head_dim=spec.hidden // spec.heads, ffn=spec.ffn, vocab=spec.vocab, rows=rows, seq=s))
    return out[:3] if quick else out


def trl_op_probes(*, quick: bool, device: torch.device, cap_s: float,
                  timed: Callable[[dict[str, Any], Callable[[], object], torch.device, float], dict[str, Any]],
                  row: Callable[..., dict[str, Any]], fail: Callable[[dict[str, Any], BaseException], dict[str, Any]],
                  configs: list[dict[str, int]] | None = None) -> list[dict[str, Any]]:
    """Rows of every TRL op at every config (probe_schema columns: m = tokens, k = hidden, n = ffn, or vocab for
    trl_head; batch, heads, kv_heads, seq_len, head_dim as attention's)."""
    dt, dtype = "fp32", torch.float32
    rows_out: list[dict[str, Any]] = []
    for cfg in configs if configs is not None else trl_op_configs(quick):
        b, s, h, a, kv, d, f, v = (cfg[x] for x in ("rows", "seq", "hidden", "heads", "kv_heads", "head_dim", "ffn",
                                                     "vocab"))
        T = b * s
        T_head = max(64, min(T, int(HEAD_MAX_FLOPS / (8.0 * h * v)) // 64 * 64))
        attn_kw = dict(batch=b, heads=a, kv_heads=kv, seq_len=s, head_dim=d, causal=True, dtype=dt)
        layer_kw = dict(m=T, k=h, n=f, batch=b, heads=a, kv_heads=kv, seq_len=s, head_dim=d, dtype=dt)
        fwd_flops = 4.0 * b * a * s * s * d * 0.5
        gemm_flops = 2.0 * T * h * (2 * a * d + 2 * kv * d) + 2.0 * T * h * f * 3
        head_kw = dict(m=T_head, k=h, n=v, numel=T_head * v, dtype=dt)
        head_flops = 2.0 * T_head * h * v
        # (row fields, builder of the (fwd, fwd_bwd) pair); the tensors are built once per op and config.
        specs: list[tuple[str, dict[str, Any], float, Callable[[], Any]]] = [
            ("trl_sdpa", attn_kw, fwd_flops, partial(sdpa_fns, b, a, kv, s, d, device, dtype)),
            ("trl_linears", layer_kw, gemm_flops, partial(linears_fn, T, h, a, kv, d, f, device, dtype)),
            ("trl_elementwise", dict(layer_kw, numel=T * h), 0.0,
             partial(elementwise_fn, b, s, h, a, kv, d, f, device, dtype)),
            # forward: one tile GEMM per tile; forward+backward: that, the recomputed tile and the two gradient GEMMs.
            ("trl_head", head_kw, head_flops, partial(head_fn, T_head, h, v, device, dtype)),
        ]
        for op, kw, fl, build in specs:
            bwd_mult = 4.0 if op == "trl_head" else 3.5 if op == "trl_sdpa" else 3.0
            r_fwd = row(op=op, pass_="fwd", flops=fl or None, **kw)
            r_fb = row(op=op, pass_="fwd_bwd", flops=fl * bwd_mult or None, **kw)
            try:
                fwd, fwd_bwd = build()
            except Exception as e:  # noqa: BLE001 - a failed probe is a row
                rows_out += [fail(r_fwd, e), fail(dict(r_fb), e)]
                continue
            rows_out.append(timed(r_fwd, fwd, device, cap_s))
            rows_out.append(timed(r_fb, fwd_bwd, device, cap_s))
            fwd = fwd_bwd = None  # free before the next op allocates
    return rows_out
