"""Generation time of a vLLM deployment: continuous batching composed from kernel predictions, then corrected.

Per replica (replicas split the prompts evenly and run side by side; the slowest sets the wall time):
1. Batching (vLLM V1's scheduler, simplified to the equal-length requests of preference-data generation): R =
   ceil(prompts / replicas) x n requests; concurrency B = min(max_num_seqs, R, KV pool tokens / (input +
   output/2)) -- blocks are taken as tokens grow, so a request holds on average its prompt and half its output;
   ceil(R / B) waves of `output_len` decode steps at batch R / waves over a mean context of input + output/2.
   Prefill: R x input tokens less prefix-cache hits (samples 2..n of a prompt reuse its full blocks; prompts after
   the first reuse the shared prefix's full blocks), in chunks of max_num_batched_tokens.
2. Step times from the kernel models (predictor.kernels, public KernelModel.predict): per layer the four GEMMs at
   m = batch (decode: skinny) or chunk tokens (prefill), attention (decode: K/V read over the context as a
   memory-bound op; prefill: the attention family), norms/activation/residual, two TP all-reduces; the output head
   and, with TP, the logits gather. Pipeline parallelism: pp micro-batches of B/pp in flight, each through L/pp
   layers, plus a send per stage boundary.
3. A learned layer, fitted only on measured vLLM rows (collect generate): wall = a_dec x decode kernels + a_pre x
   prefill kernels + c_layer x steps x layers (compute, stretched on CPUs when replicas x (tp + 0.5) exceed the
   cores) + c_step x steps + c_token x tokens (host work, stretched when replicas x (tp + 3) exceed them), by
   non-negative least squares on relative error: the engine's per-step
   scheduling and per-token bookkeeping that kernel timings do not show. Then a small gradient-boosted correction of
   log(measured / that), clipped to the range of its training residuals and shrunk to zero outside the training
   domain (distance past each feature's seen range), so it cannot run away where it has no data. On GPUs, which no
   vLLM row here covers, the correction is zero and the step overhead a stated estimate (GPU_STEP_OVERHEAD_S)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from perfpredict.core.errors import PerfPredictError
from perfpredict.core.generate import GenScenario
from perfpredict.features.generate import (
    DTYPE_BYTES,
    KVCapacity,
    default_max_num_batched_tokens,
    default_max_num_seqs,
    is_cpu,
    kv_capacity,
    kv_heads_per_rank,
)

GPU_STEP_OVERHEAD_S = 1.5e-3  # estimate: V1 scheduler + sampler + CUDA-graph launch per step, not measured here
MODEL_DIR = Path(__file__).parent / "default" / "generate"
# CPU core sharing (2 cores, vLLM's front-end and scheduler processes float over them). A replica's compute (kernels,
# per-layer dispatch) needs its tp pinned cores plus COMPUTE_EXTRA_CORES of co-scheduled work; its host work (per-step
# scheduling, per-token bookkeeping) stretches as if it needed tp + HOST_EXTRA_CORES. Chosen on the validation folds
# (leave-one-shape-out and leave-one-layout-out over the training shapes only; mean MAPE 21.3 % vs 22.5 % for the
# earlier single factor with one host core): grid 0.25-0.75 x 1-3. Fitting them on all rows instead ran to the grid
# edge and doubled the held-out two-replica error, so they are fixed.
COMPUTE_EXTRA_CORES = 0.5
HOST_EXTRA_CORES = 3.0
FEATURES = ("f_log_base", "f_tp", "f_replicas", "f_log_batch", "f_log_in", "f_log_out", "f_n", "f_prefix",
            "f_kv_pressure", "f_decode_share", "f_log_ctx")


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
        hits = prompts * (w.samples_per_prompt - 1) * (w.input_len // bs) * bs
        hits += (prompts - 1) * w.samples_per_prompt * (w.shared_prefix_len // bs) * bs
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


def _kernel_rows(sc: GenScenario, s: Schedule, idx: int) -> list[dict[str, Any]]:
    m, lay = sc.model, sc.layout
    tp, pp = lay.tp, lay.pp
    dt = sc.workload.precision
    db = DTYPE_BYTES[dt]
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
    kv_read = b * s.ctx * 2 * kvr * m.head_dim * db
    layer_ops("decode", b, pp, {"bytes": int(kv_read), "numel": int(kv_read // db)}, "copy")
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


@cache
def default_kernels():
    from perfpredict.learn.bundle import Bundle, default_path

    return Bundle.load(default_path()).kernels


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
                          dtype=sc.workload.precision)
        caps.append(cap)
        s = schedule(sc, cap) if cap.fits else None
        scheds.append(s)
        if s is not None:
            rows.extend(_kernel_rows(sc, s, i))
    per = {}
    if rows:
        kdf = pl.DataFrame(rows, infer_schema_length=None)
        for col in ("m", "n", "k", "batch", "heads", "kv_heads", "seq_len", "head_dim", "numel", "bytes",
                    "world_size", "ranks_per_node"):
            if col not in kdf.columns:
                kdf = kdf.with_columns(pl.lit(None, dtype=pl.Int64).alias(col))
            kdf = kdf.with_columns(pl.col(col).cast(pl.Int64))
        t = _monotone_collectives(kdf, kernels)
        kdf = kdf.with_columns(t_s=pl.Series(t) * pl.col("mult"))
        agg = kdf.group_by("scenario", "part").agg(pl.col("t_s").sum())
        per = {(r["scenario"], r["part"]): r["t_s"] for r in agg.iter_rows(named=True)}
    out = []
    for i, (sc, cap, s) in enumerate(zip(scs, caps, scheds, strict=True)):
        w, lay = sc.workload, sc.layout
        row: dict[str, Any] = {"fits": cap.fits, "reason": cap.reason, "kv_capacity_tokens": cap.logged_tokens,
                               "kv_pool_tokens": cap.pool_tokens, "kv_blocks": cap.num_blocks,
                               "weights_gib_per_rank": cap.weights_bytes / 2**30, "is_cpu": is_cpu(sc.cluster.gpu),
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


class GenerationModel:
    """Linear engine overheads + bounded correction over the kernel composition (scikit-learn-style fit/predict
    on composed frames). Saved as JSON + xgboost JSON, checked on load."""

    def __init__(self, *, seed: int = 0) -> None:
        self.seed = seed

    host_cores_: tuple[float, float] = (COMPUTE_EXTRA_CORES, HOST_EXTRA_CORES)

    @staticmethod
    def oversubscription(comp: pl.DataFrame, extra: float) -> np.ndarray:
        need = comp["replicas"].to_numpy() * (comp["ranks_per_replica"].to_numpy() + extra)
        over = np.maximum(1.0, need / comp["cores"].to_numpy())
        return np.where(comp["is_cpu"].to_numpy().astype(bool), over, 1.0)

    def _terms(self, comp: pl.DataFrame) -> np.ndarray:
        """Columns of the linear base (per replica): decode kernels, prefill kernels, steps, tokens, steps x layers.
        On CPUs the compute columns (kernels, per-layer dispatch floor) and the host columns (per-step scheduling,
        per-token bookkeeping) each stretch by their oversubscription of the cores (see COMPUTE_EXTRA_CORES)."""
        st = comp["steps"].to_numpy().astype(float)
        tok = comp["tokens"].to_numpy().astype(float)
        oc = self.oversubscription(comp, self.host_cores_[0])
        oh = self.oversubscription(comp, self.host_cores_[1])
        # Decode and prefill kernels apart (skinny vs. fat GEMMs run at different fractions of the probes' speed in
        # vLLM's CPU kernels), and a per-layer floor per step: eager mode dispatches ~15 ops per layer whatever
        # their size (the same floor compose.KERNELS_FWD_PER_LAYER gives training steps).
        dec = comp["decode_kernel_s"].to_numpy()
        pre = comp["kernel_s"].to_numpy() - dec
        sl = st * comp["layers_per_stage"].to_numpy().astype(float)
        return np.column_stack([dec * oc, pre * oc, st * oh, tok * oh, sl * oc])

    def base(self, comp: pl.DataFrame) -> np.ndarray:
        A = self._terms(comp)
        cpu = comp["is_cpu"].to_numpy().astype(bool)
        k = comp["kernel_s"].to_numpy()
        st = comp["steps"].to_numpy().astype(float)
        return np.where(cpu, A @ np.asarray(self.coef_), k + GPU_STEP_OVERHEAD_S * st)

    def _X(self, comp: pl.DataFrame, base: np.ndarray) -> np.ndarray:
        return np.column_stack([np.log10(np.maximum(base, 1e-9))] +
                               [comp[f].to_numpy().astype(float) for f in FEATURES[1:]])

    def fit(self, comp: pl.DataFrame, wall_s: np.ndarray) -> GenerationModel:
        from scipy.optimize import nnls

        from perfpredict.learn.gb import GBRegressor

        cpu = comp["is_cpu"].to_numpy().astype(bool)
        if not cpu.all():
            raise PerfPredictError("the generation correction is fitted on CPU vLLM rows only")
        coef, _ = nnls(self._terms(comp) / wall_s[:, None], np.ones(len(wall_s)))
        self.coef_ = tuple(float(x) for x in coef)
        base = self.base(comp)
        X = self._X(comp, base)
        y = np.log10(wall_s / base)
        self.gb_ = GBRegressor(seed=self.seed, n_estimators=120, max_depth=3, learning_rate=0.05,
                               min_child_weight=4.0, subsample=0.8, colsample_bytree=0.9).fit(X, y)
        self.lo_, self.hi_ = X.min(axis=0), X.max(axis=0)
        self.clip_ = (float(np.quantile(y, 0.02)), float(np.quantile(y, 0.98)))
        resid = y - np.clip(self.gb_.predict(X), *self.clip_)
        self.interval_ = (float(np.quantile(resid, 0.05)), float(np.quantile(resid, 0.95)))
        return self

    def shrink(self, X: np.ndarray) -> np.ndarray:
        span = np.maximum(self.hi_ - self.lo_, 1e-6)
        d = (np.maximum(X - self.hi_, 0) + np.maximum(self.lo_ - X, 0)) / span
        return np.exp(-3.0 * d.sum(axis=1))

    def predict_wall(self, comp: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Predicted wall seconds, and a 90% interval (lower, upper) from the held-in residual quantiles."""
        base = self.base(comp)
        X = self._X(comp, base)
        corr = np.clip(self.gb_.predict(X), *self.clip_) * self.shrink(X)
        cpu = comp["is_cpu"].to_numpy().astype(bool)
        corr = np.where(cpu, corr, 0.0)
        wall = base * 10.0 ** corr
        lo, hi = self.interval_
        widen = np.where(cpu, 1.0, 3.0)  # no vLLM measurement on GPUs: say so in the interval
        return wall, wall * 10.0 ** (lo * widen), wall * 10.0 ** (hi * widen)

    def save(self, out: Path | str = MODEL_DIR) -> Path:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        self.gb_.save_model(out / "correction.json")
        meta = {"kind": "perfpredict.generation", "version": 6, "features": list(FEATURES), "coef": self.coef_,
                "host_cores": list(self.host_cores_),
                "lo": self.lo_.tolist(), "hi": self.hi_.tolist(), "clip": self.clip_, "interval": self.interval_,
                "training": getattr(self, "training_", {})}
        (out / "metadata.json").write_text(json.dumps(meta, indent=1))
        return out

    @classmethod
    def load(cls, path: Path | str = MODEL_DIR) -> GenerationModel:
        from perfpredict.learn.gb import GBRegressor

        path = Path(path)
        try:
            meta = json.loads((path / "metadata.json").read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise PerfPredictError(f"no generation model at {path}: {e}; train it with "
                                   "`perfpredict evaluate --phase generate --save`") from None
        if (meta.get("kind") != "perfpredict.generation" or meta.get("version") != 6
                or meta.get("features") != list(FEATURES)):
            raise PerfPredictError(f"{path} holds a generation model for other features; retrain it")
        m = cls()
        m.coef_ = tuple(meta["coef"])
        m.host_cores_ = tuple(float(x) for x in meta["host_cores"])
        m.lo_, m.hi_ = np.array(meta["lo"]), np.array(meta["hi"])
        m.clip_, m.interval_ = tuple(meta["clip"]), tuple(meta["interval"])
        m.training_ = meta.get("training", {})
        m.gb_ = GBRegressor.load_model(path / "correction.json")
        return m


@cache
def default_model() -> GenerationModel:
    return GenerationModel.load(MODEL_DIR)


def predict_generation(scs: list[GenScenario], *, model: GenerationModel | None = None,
                       kernels=None) -> pl.DataFrame:
    """Predicted throughput, KV capacity and time to generate, one row per scenario (issue 11's output keys)."""
    model = model or default_model()
    comp = compose(scs, kernels=kernels)
    ok = comp["fits"].to_numpy()
    wall = np.full(len(scs), np.nan)
    lo = np.full(len(scs), np.nan)
    hi = np.full(len(scs), np.nan)
    if ok.any():
        sub = comp.filter(pl.col("fits"))
        w, a, b = model.predict_wall(sub)
        wall[ok], lo[ok], hi[ok] = w, a, b
    rows = []
    for i, sc in enumerate(scs):
        wl = sc.workload
        out_tok = wl.output_tokens
        tot = out_tok + wl.prompts * wl.samples_per_prompt * wl.input_len
        fits = bool(ok[i])
        r = {"layout": sc.layout.label(), "tp": sc.layout.tp, "pp": sc.layout.pp, "replicas": sc.layout.replicas,
             "max_num_seqs": sc.layout.max_num_seqs or default_max_num_seqs(sc.cluster.gpu, sc.layout.tp * sc.layout.pp),
             "gpus": sc.layout.gpus, "fits": fits, "reason": comp["reason"][i],
             "kv_capacity_tokens": int(comp["kv_capacity_tokens"][i]),
             "weights_gib_per_rank": float(comp["weights_gib_per_rank"][i]),
             "time_to_generate_s": float(wall[i]) if fits else None,
             "time_to_generate_s_interval": [float(lo[i]), float(hi[i])] if fits else None,
             "output_tokens_per_s": out_tok / wall[i] if fits else None,
             "output_tokens_per_s_interval": [out_tok / hi[i], out_tok / lo[i]] if fits else None,
             "total_tokens_per_s": tot / wall[i] if fits else None,
             "output_tokens_per_s_per_gpu": out_tok / wall[i] / sc.layout.gpus if fits else None,
             "decode_batch": float(comp["batch"][i]) if fits and "batch" in comp.columns else None}
        rows.append(r)
    return pl.DataFrame(rows, infer_schema_length=None)
