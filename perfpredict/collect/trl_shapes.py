"""The random-weight Llama shapes `perfpredict collect trl` measures (collect.trl.grid) and `collect probes
--families trl` probes (collect.probes.trl_ops): one list, so the TRL-op probes time the shapes the TRL runs ran."""

from __future__ import annotations

from perfpredict.core.model import ModelSpec

# Random-weight Llama shapes (untied embeddings, SwiGLU): ~1.6M to ~29M parameters, vocab 1k-32k.
SHAPES: dict[str, ModelSpec] = {s.name: s for s in (
    ModelSpec(name="t1-2k", layers=4, hidden=128, heads=4, kv_heads=4, ffn=512, vocab=2048),
    ModelSpec(name="t2-8k", layers=4, hidden=256, heads=8, kv_heads=4, ffn=768, vocab=8192),
    ModelSpec(name="t3-4k-deep", layers=8, hidden=256, heads=4, kv_heads=2, ffn=1024, vocab=4096),
    ModelSpec(name="t4-32k-narrow", layers=2, hidden=128, heads=4, kv_heads=2, ffn=512, vocab=32000),
    ModelSpec(name="t5-16k", layers=6, hidden=256, heads=8, kv_heads=2, ffn=1024, vocab=16384),
    ModelSpec(name="t6-1k-wide", layers=2, hidden=768, heads=12, kv_heads=4, ffn=2048, vocab=1024),
    ModelSpec(name="t7-16k-big", layers=4, hidden=512, heads=8, kv_heads=4, ffn=1536, vocab=16384),
)}

# GPU shapes (a lent GPU: collect.device), kept apart so the CPU grid's rotation over SHAPES and its run_ids stay as
# collected. Llama-3.2-1B's dimensions (tied embeddings, 1.24B parameters) and Qwen2.5-0.5B's on a Llama body (no
# qkv bias; 0.49B), random weights.
GPU_SHAPES: dict[str, ModelSpec] = {s.name: s for s in (
    ModelSpec(name="g1-llama-1b", layers=16, hidden=2048, heads=32, kv_heads=8, ffn=8192, vocab=128256, head_dim=64,
              tied_embeddings=True),
    ModelSpec(name="g2-qwen-0.5b", layers=24, hidden=896, heads=14, kv_heads=2, ffn=4864, vocab=151936, head_dim=64,
              tied_embeddings=True),
)}
ALL_SHAPES: dict[str, ModelSpec] = {**SHAPES, **GPU_SHAPES}
