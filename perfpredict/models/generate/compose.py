"""Generation time of a vLLM deployment composed from kernel predictions (the corrected model: models.generate.model).

Per replica (replicas split the prompts evenly and run side by side; the slowest sets the wall time):
1. Batching (vLLM V1's scheduler, simplified to the equal-length requests of preference-data generation): R =
   ceil(prompts / replicas) x n requests; concurrency B = min(max_num_seqs, R, KV pool tokens / (input +
   output/2)) -- blocks are taken as tokens grow, so a request holds on average its prompt and half its output;
   ceil(R / B) waves of `output_len` decode steps at batch R / waves over a mean context of input + output/2.
   Prefill: R x input tokens less prefix-cache hits (features.generate.prefix_cache_hit_tokens: samples 2..n of a
   prompt reuse its full blocks; the first sample of later prompts the shared prefix's; never the last token), in
   chunks of max_num_batched_tokens.
2. Step times from the kernel models (models.kernels, public KernelModel.predict): per layer the four GEMMs at
   m = batch (decode: skinny) or chunk tokens (prefill), attention (decode: K/V read over the context as a
   memory-bound op; prefill: the attention family), norms/activation/residual, two TP all-reduces; the output head
   and, with TP, the logits gather. Pipeline parallelism: pp micro-batches of B/pp in flight, each through L/pp
   layers, plus a send per stage boundary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from perfpredict.core.generate import GenScenario
from perfpredict.features.generate import (
    DTYPE_BYTES,
    KVCapacity,
    activation_dtype,
    default_max_num_batched_tokens,
    default_max_num_seqs,
    kv_cache_dtype_of,
    kv_capacity,
    kv_heads_per_rank,
    prefix_cache_hit_tokens,
)
from perfpredict.models.bundle import default_kernels

GPU_STEP_OVERHEAD_S = 1.5e-3  # estimate: V1 scheduler + sampler + CUDA-graph launch per step, not measured here


@dataclass(frozen=True)
class Schedule:
    requests: int          # per replica
    batch: float           # mean decode batch
    waves: int
    decode_steps: int
    ctx: float             # mean context length in decode
    prefill_tokens: float  # computed (after prefix hits), per replica
    chunk_tokens: float
    prefill_chunks: int
    kv_pressure: float     # B x (in + out) / pool: > 1 means requests outgrow the pool (preemptions)
    preemptions: int = 0   # estimated evictions (each recomputes its prompt and half the output)


def schedule(sc: GenScenario, cap: KVCapacity) -> Schedule:
    w, lay = sc.workload, sc.layout
    world = lay.tp * lay.pp
    mns = lay.max_num_seqs or default_max_num_seqs(sc.cluster.gpu, world)
    mbt = lay.max_num_batched_tokens or default_max_num_batched_tokens(sc.cluster.gpu, world)
    prompts = math.ceil(w.prompts / lay.replicas)
    R = prompts * w.samples_per_prompt
    foot = w.input_len + w.output_len / 2
    B = max(1, min(mns, R, int(cap.pool_tokens // foot)))
    waves = math.ceil(R / B)
    bs = cap.block_size
    hits = 0
    if lay.prefix_caching:
        hits = prefix_cache_hit_tokens(prompts=prompts, samples_per_prompt=w.samples_per_prompt,
                                       input_len=w.input_len, shared_prefix_len=w.shared_prefix_len, block_size=bs)
    pre = max(R * w.input_len - hits, R)
    # Preemption (V1 recompute): the scheduler admits a request while the pool holds its prompt's blocks, so up to
    # pool / prompt requests start, more than the pool sustains to the end (pool / (input + output)); as they grow
    # the newest are evicted and later prefilled again over their prompt and the tokens generated so far. Estimated
    # once per excess request per wave; checked against the engines' preemption counters on the collected rows
    # (correlation 0.76, all 48 configurations with preemptions flagged, 4 false alarms).
    admit = min(mns, R, cap.pool_tokens // (math.ceil(w.input_len / bs) * bs))
    sustain = max(1, cap.pool_tokens // (math.ceil((w.input_len + w.output_len) / bs) * bs))
    preempt = max(0, admit - sustain) * math.ceil(R / max(admit, 1))
    pre += preempt * (w.input_len + w.output_len / 2)
    chunk = max(1.0, min(float(mbt), R / waves * pre / R))
    return Schedule(requests=R, batch=R / waves, waves=waves, decode_steps=waves * w.output_len,
                    ctx=w.input_len + w.output_len / 2, prefill_tokens=pre, chunk_tokens=chunk,
                    prefill_chunks=math.ceil(pre / chunk), kv_pressure=B * (w.input_len + w.output_len) /
                    max(cap.pool_tokens, 1), preemptions=preempt)


def kernel_rows(sc: GenScenario, s: Schedule, idx: int) -> list[dict[str, Any]]:
    m, lay = sc.model, sc.layout
    tp, pp = lay.tp, lay.pp
    dt = sc.workload.precision
    db = DTYPE_BYTES[activation_dtype(dt)]  # activations, all-reduces, stage sends: the model data type
    db_kv = DTYPE_BYTES[kv_cache_dtype_of(dt, lay.kv_cache_dtype)]
    hw = sc.cluster.gpu.name
    L = m.layers / pp
    f = m.expert_ffn * m.experts_per_token if m.is_moe else m.ffn
    kvr = kv_heads_per_rank(m, tp)
    rpn = min(tp, sc.cluster.gpus_per_node)
    rows: list[dict[str, Any]] = []

    def add(part: str, mult: float, op: str, **kw: Any) -> None:
        rows.append({"scenario": idx, "part": part, "mult": float(mult), "hardware": hw, "op": op,
                     "pass_": "comm" if op in ("all_reduce", "all_gather", "send_recv") else "fwd", "dtype": dt, **kw})

    def layer_ops(part: str, tokens: int, mult: float, attn: dict[str, Any], attn_op: str) -> None:
        g = dict(m=tokens, k=m.hidden)
        add(part, mult * L, "gemm", **g, n=max(1, (m.heads // tp + 2 * kvr) * m.head_dim))
        add(part, mult * L, "gemm", m=tokens, k=max(1, m.heads // tp * m.head_dim), n=m.hidden)
        add(part, mult * L, "gemm", **g, n=max(1, 2 * f // tp))
        add(part, mult * L, "gemm", m=tokens, k=max(1, f // tp), n=m.hidden)
        add(part, mult * L, attn_op, **attn)
        add(part, mult * L * 2, "rmsnorm", numel=tokens * m.hidden)
        add(part, mult * L, "swiglu", numel=tokens * max(1, f // tp))
        add(part, mult * L * 2, "add", numel=tokens * m.hidden)
        if tp > 1:
            add(part, mult * L * 2, "all_reduce", bytes=tokens * m.hidden * db, world_size=tp, ranks_per_node=rpn)
        if pp > 1:
            add(part, mult, "send_recv", bytes=tokens * m.hidden * db, world_size=2, ranks_per_node=2)

    # Decode: one step = pp micro-steps of batch B/pp (a pipeline keeps pp micro-batches in flight).
    b = max(1, round(s.batch / pp))
    kv_read = b * s.ctx * 2 * kvr * m.head_dim * db_kv
    layer_ops("decode", b, pp, {"bytes": int(kv_read), "numel": int(kv_read // db_kv)}, "copy")
    add("decode", pp, "gemm", m=b, k=m.hidden, n=max(1, m.vocab // tp))
    if tp > 1:
        add("decode", pp, "all_gather", bytes=b * m.vocab // tp * 4, world_size=tp, ranks_per_node=rpn)
    # Prefill: one chunk of T tokens made of sequences of input_len (or fewer, after prefix hits).
    T = max(1, round(s.chunk_tokens))
    seq = max(1, min(sc.workload.input_len, T))
    layer_ops("prefill", T, 1, {"batch": max(1, T // seq), "heads": max(1, m.heads // tp), "kv_heads": kvr,
                                "seq_len": seq, "head_dim": m.head_dim}, "attention")
    add("prefill", 1, "gemm", m=max(1, T // seq), k=m.hidden, n=max(1, m.vocab // tp))
    return rows


COLLECTIVE_OPS = ("all_reduce", "all_gather", "send_recv")


def _monotone_collectives(kdf: pl.DataFrame, kernels) -> np.ndarray:
    """Kernel seconds per row, a collective never faster than the same buffer over fewer ranks of the same node.

    The learned collective model is not monotone in world size at small buffers (an A100 all-reduce of 32 KB:
    37 us over 2 ranks, 10 us over 4, 33 us over 8), which made a TP-4 decode step more than twice as fast as a
    TP-2 one: a superlinear speed-up no ring or tree gives (both add latency steps and bus bytes as ranks grow).
    Each collective row takes the largest prediction over world sizes 2, 4, ... up to its own."""
    q = kdf.drop("scenario", "part", "mult")
    t = kernels.predict(q)
    coll = kdf["op"].is_in(list(COLLECTIVE_OPS)).to_numpy() & (kdf["world_size"].fill_null(1).to_numpy() > 2)
    if not coll.any():
        return t
    sub = q.filter(pl.Series(coll)).with_row_index("_row")
    worlds = [w for w in (2, 4, 8, 16, 32, 64) if w < int(sub["world_size"].max())]
    extra = pl.concat([sub.filter(pl.col("world_size") > w).with_columns(
        world_size=pl.lit(w, dtype=pl.Int64), ranks_per_node=pl.min_horizontal("ranks_per_node", pl.lit(w)))
        for w in worlds], how="vertical_relaxed")
    if extra.height:
        te = kernels.predict(extra.drop("_row"))
        env = pl.DataFrame({"_row": extra["_row"], "t": te}).group_by("_row").agg(pl.col("t").max())
        idx = np.flatnonzero(coll)
        low = np.zeros(len(idx))
        low[env["_row"].to_numpy()] = env["t"].to_numpy()
        t[idx] = np.maximum(t[idx], low)
    return t


def kernel_frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """kernel_rows as the frame KernelModel.predict reads: every shape column present, as integers."""
    kdf = pl.DataFrame(rows, infer_schema_length=None)
    for col in ("m", "n", "k", "batch", "heads", "kv_heads", "seq_len", "head_dim", "numel", "bytes", "world_size",
                "ranks_per_node"):
        if col not in kdf.columns:
            kdf = kdf.with_columns(pl.lit(None, dtype=pl.Int64).alias(col))
        kdf = kdf.with_columns(pl.col(col).cast(pl.Int64))
    return kdf


def compose(scs: list[GenScenario], *, kernels=None) -> pl.DataFrame:
    """One row per scenario: capacity, schedule, kernel seconds per decode step / prefill chunk, the linear base
    parts and the correction's features. Scenarios that do not fit get fits=False and null times."""
    kernels = kernels or default_kernels()
    caps, scheds, rows = [], [], []
    for i, sc in enumerate(scs):
        lay = sc.layout
        cap = kv_capacity(sc.model, sc.cluster.gpu, tp=lay.tp, pp=lay.pp, max_model_len=sc.max_model_len,
                          max_num_seqs=lay.max_num_seqs, max_num_batched_tokens=lay.max_num_batched_tokens,
                          gpu_memory_utilization=lay.gpu_memory_utilization,
                          kv_cache_memory_bytes=lay.kv_cache_memory_bytes, kv_space_gib=lay.kv_space_gib,
                          dtype=sc.workload.precision, kv_cache_dtype=lay.kv_cache_dtype)
        caps.append(cap)
        s = schedule(sc, cap) if cap.fits else None
        scheds.append(s)
        if s is not None:
            rows.extend(kernel_rows(sc, s, i))
    per = {}
    if rows:
        kdf = kernel_frame(rows)
        t = _monotone_collectives(kdf, kernels)
        kdf = kdf.with_columns(t_s=pl.Series(t) * pl.col("mult"))
        agg = kdf.group_by("scenario", "part").agg(pl.col("t_s").sum())
        per = {(r["scenario"], r["part"]): r["t_s"] for r in agg.iter_rows(named=True)}
    out = []
    for i, (sc, cap, s) in enumerate(zip(scs, caps, scheds, strict=True)):
        w, lay = sc.workload, sc.layout
        row: dict[str, Any] = {"fits": cap.fits, "reason": cap.reason, "kv_capacity_tokens": cap.logged_tokens,
                               "kv_pool_tokens": cap.pool_tokens, "kv_blocks": cap.num_blocks,
                               "weights_gib_per_rank": cap.weights_bytes / 2**30, "is_cpu": sc.cluster.gpu.is_cpu,
                               "hardware": sc.cluster.gpu.name,
                               # CPU only: replicas x (tp compute cores + host cores) vs the cores (see _terms)
                               "ranks_per_replica": lay.tp * lay.pp, "replicas": lay.replicas,
                               "cores": sc.cluster.gpus}
        if s is not None:
            dec, pre = per.get((i, "decode"), 0.0), per.get((i, "prefill"), 0.0)
            kern = s.decode_steps * dec + s.prefill_chunks * pre
            row.update(decode_step_kernel_s=dec, prefill_chunk_kernel_s=pre, kernel_s=kern,
                       decode_kernel_s=s.decode_steps * dec, layers_per_stage=sc.model.layers / lay.pp,
                       steps=s.decode_steps + s.prefill_chunks, tokens=s.requests * w.output_len,
                       batch=s.batch, waves=s.waves, prefill_tokens=s.prefill_tokens,
                       f_tp=float(lay.tp), f_replicas=float(lay.replicas), f_log_batch=math.log10(s.batch),
                       f_log_in=math.log10(w.input_len), f_log_out=math.log10(w.output_len),
                       f_n=float(w.samples_per_prompt), f_prefix=float(lay.prefix_caching),
                       f_kv_pressure=min(s.kv_pressure, 10.0),
                       f_decode_share=s.decode_steps * dec / max(kern, 1e-12), f_log_ctx=math.log10(s.ctx))
        out.append(row)
    return pl.DataFrame(out, infer_schema_length=None)
