"""Kernel and collective probes: the per-op measurements the predictor's kernel models learn from.

Families (rows follow perfpredict.core.dataset.probe_schema(), with provenance):
- gemm: forward (m,k)x(k,n), grad-input (m,n)x(n,k), grad-weight (k,m)x(m,n), over the shapes catalog models
  produce for each linear layer sharded by tp = 1, 2, 4, 8 (qkv, attention output, MLP up/gate and down, expert
  MLPs, LM head) at a few token counts m, plus a log-spaced grid around them.
- attention: F.scaled_dot_product_attention, causal, fwd and fwd+bwd, over batch, heads, kv heads (GQA through
  enable_gqa), seq and head_dim. FLOPs: 4*b*h*s^2*d/2 forward (causal half); fwd+bwd counts 3.5x that (backward
  = 2.5x forward, the FlashAttention-2 convention). Rows carry causal=True and attn_impl, the SDPA backend that
  really ran (read from the profiler's op names once per config, see sdpa_impl).
- memory-bound: rmsnorm, swiglu, softmax, cross_entropy over a full vocabulary (fp32 upcast as TRL; fwd and
  fwd+bwd), elementwise add, AdamW step over a flat fp32 buffer. `bytes` is the minimum traffic.
- collectives: all_reduce, all_gather, reduce_scatter, all_to_all, send_recv, broadcast, 4 KiB .. 1 GiB, for every
  world size the machine allows, through torchrun (comm_probe.py).
- trl (not in the default families; `--families trl`): the ops transformers' Llama and TRL's fused head really run
  (trl_ops.py), written to probes-trl.parquet beside probes.parquet so the generic kernel files stay as collected.
- decode (not in the default families; `--families decode`): one generation decode step's kernels, forward GEMMs
  at decode m (1..512 running sequences) and `decode_attention` (one query token per sequence over 512..32k cached
  tokens, SDPA), rows of probes.parquet beside the aiconfigurator importer's measured ones.
A probe that fails (OOM, unsupported dtype, error) is a row with outcome set, never a crash.

Budgets. CPU (1 thread, as each training rank has): --quick < 2 min: 6 GEMM shapes, 4 attention and 7
memory-bound configs, fp32 + bf16, collectives 4 KiB-1 MiB on 2 ranks. Full CPU suite < 10 min: GEMMs capped at
2 GFLOP each (~90 shapes x 3 passes x 2 dtypes, 0.25 s per probe), 24 attention configs, memory ops up to 2^24
elements, collectives 4 KiB-256 MiB on world 2 (and 4, oversubscribed, flagged).

Plan for an 8-GPU node (H100/H200 class), full suite < 15 min in all:
- gemm: ~350 shapes (catalog models x tp 1..8 x m in 1k..16k tokens, + 120 grid points) x 3 passes x 2 dtypes
  (bf16, fp32); 25 repeats or 0.2 s per probe, ~0.3 ms per launch -> ~6 min worst case, ~3 min typical.
- attention: ~150 configs (b 1-8, heads 8-64, GQA groups 1/4/8, seq 512-16k, d 64/128) x 2 passes x bf16,
  capped at 0.2 s each -> ~1.5 min.
- memory-bound: 6 ops x 8 sizes (2^20..2^30 elements) x 2 dtypes at 0.1 s -> ~1 min.
- collectives: 6 ops x 19 sizes (4 KiB..1 GiB, x2 steps) x world {2, 4, 8}, capped at 0.5 s each (most take a
  few ms) plus torchrun start ~20 s per world -> ~4 min.
The same `perfpredict collect probes` command runs across nodes when launched per node by the cluster's torchrun
(comm_probe.py is an ordinary torchrun module)."""

from __future__ import annotations

import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from perfpredict.collect import fingerprint as fpr
from perfpredict.collect.host import default_out
from perfpredict.collect.probes.trl_ops import trl_op_probes
from perfpredict.collect.processes import pythonpath_first
from perfpredict.collect.timing import measure
from perfpredict.core.errors import PerfPredictError

if TYPE_CHECKING:  # polars only where the rows are written: probe_rows runs where torch alone is installed
    import polars as pl

FAMILIES = ("gemm", "attention", "memory", "comm", "trl", "decode")
DEFAULT_FAMILIES = ("gemm", "attention", "memory", "comm")
DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
KiB = 1024


@dataclass(frozen=True)
class Budget:
    """Caps of one probe suite (see the module docstring for the plans they implement)."""

    dtypes: tuple[str, ...]
    gemm_tokens: tuple[int, ...]
    gemm_max_flops: float
    gemm_shapes: int
    gemm_grid: int
    attn_configs: int
    attn_max_flops: float
    mem_sizes: tuple[int, ...]
    comm_sizes: tuple[int, ...]
    comm_worlds: tuple[int, ...]
    cap_s: float
    comm_cap_s: float
    tp: tuple[int, ...] = (1, 2, 4, 8)


def budget(*, quick: bool, gpu: bool, devices: int, cores: int) -> Budget:
    if gpu:
        worlds = tuple(w for w in (2, 4, 8) if w <= devices)
        if quick:
            return Budget(("bf16",), (2048,), 1e13, 12, 6, 6, 1e13, (1 << 20, 1 << 24), (4 * KiB, 1 << 20, 1 << 24),
                          worlds[:1], 0.1, 0.2)
        return Budget(("bf16", "fp32"), (1024, 4096, 16384), 5e13, 350, 120, 150, 5e13,
                      tuple(1 << e for e in range(20, 31, 2)) + (1 << 30,),
                      tuple(4 * KiB * 2**i for i in range(19)), worlds, 0.2, 0.5)
    worlds_cpu = tuple(sorted({2, max(2, cores)}))
    if quick:
        return Budget(("fp32", "bf16"), (128,), 2.5e8, 6, 0, 4, 2e8, (1 << 16, 1 << 20),
                      (4 * KiB, 64 * KiB, 1 << 20), (2,), 0.15, 0.3)
    return Budget(("fp32", "bf16"), (128, 512), 2e9, 90, 30, 24, 2e9, (1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24),
                  tuple(4 * KiB * 4**i for i in range(9)), worlds_cpu + ((4,) if 4 not in worlds_cpu else ()),
                  0.25, 1.0, tp=(1, 2, 4))


def _row(**kw: Any) -> dict[str, Any]:
    base = {"outcome": "ok", "error": None}
    base.update(kw)
    return base


def _fail_row(row: dict[str, Any], e: BaseException) -> dict[str, Any]:
    msg = str(e).lower()
    oom = isinstance(e, torch.OutOfMemoryError) or "out of memory" in msg or "allocate" in msg
    row.update(outcome="oom" if oom else "error", error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
    return row


def _timed(row: dict[str, Any], fn: Callable[[], object], device: torch.device, cap_s: float) -> dict[str, Any]:
    try:
        t = measure(fn, device=device, warmup=2, min_repeats=3, max_repeats=25, time_cap_s=cap_s)
        row.update(time_s=t.median_s, time_spread=t.cv, repeats=t.repeats)
    except Exception as e:  # noqa: BLE001 - a failing probe is a row
        _fail_row(row, e)
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


# --- GEMM --------------------------------------------------------------------------------------------------------
def model_gemm_shapes(tps: tuple[int, ...]) -> list[tuple[int, int]]:
    """(k, n) of every linear layer of every catalog model, sharded by each tp (column-parallel splits n,
    row-parallel splits k)."""
    from perfpredict.core.catalog import model_catalog

    out: set[tuple[int, int]] = set()
    for m in model_catalog().values():
        q, kv = m.heads * m.head_dim, m.kv_heads * m.head_dim
        ffn = m.expert_ffn if m.is_moe else m.ffn
        for tp in tps:
            if m.heads % tp or ffn % tp:
                continue
            out |= {(m.hidden, (q + 2 * kv) // tp), (q // tp, m.hidden), (m.hidden, ffn // tp),
                    (ffn // tp, m.hidden), (m.hidden, -(-m.vocab // tp))}
    return sorted(out)


def _gemm_fns(a: torch.Tensor, w: torch.Tensor, dy: torch.Tensor) -> list[tuple[str, Callable[[], object]]]:
    # As autograd runs a linear layer: Y = A W, dA = dY W^T, dW = A^T dY (the transposes are views, not copies).
    return [("fwd", lambda: a @ w), ("bwd_input", lambda: dy @ w.t()), ("bwd_weight", lambda: a.t() @ dy)]


def gemm_probes(b: Budget, device: torch.device, rng: random.Random) -> list[dict[str, Any]]:
    shapes: list[tuple[int, int, int]] = []
    for k, n in model_gemm_shapes(b.tp):
        fits = [m for m in b.gemm_tokens if 2 * m * n * k <= b.gemm_max_flops]
        shapes += [(m, n, k) for m in fits]
    shapes = sorted(set(shapes))
    if len(shapes) > b.gemm_shapes:
        shapes = sorted(rng.sample(shapes, b.gemm_shapes))
    grid = []
    while len(grid) < b.gemm_grid:  # log-uniform around the model shapes
        m, n, k = (int(2 ** rng.uniform(6, 13)) // 16 * 16 for _ in range(3))
        if m and n and k and 2 * m * n * k <= b.gemm_max_flops:
            grid.append((m, n, k))
    rows = []
    for dt in b.dtypes:
        for m, n, k in shapes + grid:
            flops = 2.0 * m * n * k
            try:
                a = torch.randn(m, k, device=device, dtype=DT[dt])
                w = torch.randn(k, n, device=device, dtype=DT[dt])
                dy = torch.randn(m, n, device=device, dtype=DT[dt])
            except Exception as e:  # noqa: BLE001
                for p in ("fwd", "bwd_input", "bwd_weight"):
                    rows.append(_fail_row(_row(op="gemm", pass_=p, dtype=dt, m=m, n=n, k=k, flops=flops), e))
                continue
            for p, fn in _gemm_fns(a, w, dy):
                rows.append(_timed(_row(op="gemm", pass_=p, dtype=dt, m=m, n=n, k=k, flops=flops), fn, device,
                                   b.cap_s))
            a = w = dy = None  # free before the next shape allocates
    return rows


# --- attention ---------------------------------------------------------------------------------------------------
def attention_configs(b: Budget, rng: random.Random, gpu: bool) -> list[tuple[int, int, int, int, int]]:
    seqs = (512, 1024, 2048, 4096, 8192, 16384) if gpu else (128, 256, 512, 1024)
    cand = []
    for batch in ((1, 2, 4, 8) if gpu else (1, 2)):
        for heads in ((8, 16, 32, 64) if gpu else (4, 8, 16)):
            for group in (1, 4, 8):
                if heads % group:
                    continue
                for s in seqs:
                    for d in (64, 128):
                        if 2 * batch * heads * s * s * d <= b.attn_max_flops:
                            cand.append((batch, heads, heads // group, s, d))
    return sorted(rng.sample(cand, min(b.attn_configs, len(cand))))


def _attn_fns(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              go: torch.Tensor) -> tuple[Callable[[], object], Callable[[], object]]:
    gqa = q.shape[1] != k.shape[1]

    def fwd() -> torch.Tensor:
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

    def fwd_bwd() -> None:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        torch.autograd.grad(o, (q, k, v), go)

    return fwd, fwd_bwd


# The aten op each SDPA backend dispatches to (torch/nn/functional.py scaled_dot_product_attention ->
# aten/src/ATen/native/transformers/attention.cpp _fused_sdp_choice), mapped to core.dataset.ATTN_IMPLS.
# PyTorch's CUDA flash backend is FlashAttention-2.
SDPA_OPS = {"aten::_scaled_dot_product_flash_attention_for_cpu": "sdpa-cpu",
            "aten::_scaled_dot_product_flash_attention": "flash2",
            "aten::_scaled_dot_product_cudnn_attention": "cudnn",
            "aten::_scaled_dot_product_efficient_attention": "mem_efficient",
            "aten::_scaled_dot_product_attention_math": "math"}


def sdpa_impl(fn: Callable[[], object]) -> str | None:
    """The SDPA backend fn runs, from the op names a profiled call records (None if none is recognised)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    names = {e.key for e in prof.key_averages()}
    for op, impl in SDPA_OPS.items():  # fused kernels first: math is also the name of their fallback
        if op in names:
            return impl
    return None


def attention_probes(b: Budget, device: torch.device, rng: random.Random, gpu: bool) -> list[dict[str, Any]]:
    rows = []
    for dt in b.dtypes:
        for batch, h, kvh, s, d in attention_configs(b, rng, gpu):
            fwd_flops = 4.0 * batch * h * s * s * d * 0.5
            kw = dict(op="attention", dtype=dt, batch=batch, heads=h, kv_heads=kvh, seq_len=s, head_dim=d,
                      causal=True)
            try:
                q = torch.randn(batch, h, s, d, device=device, dtype=DT[dt], requires_grad=True)
                k = torch.randn(batch, kvh, s, d, device=device, dtype=DT[dt], requires_grad=True)
                v = torch.randn(batch, kvh, s, d, device=device, dtype=DT[dt], requires_grad=True)
                go = torch.randn(batch, h, s, d, device=device, dtype=DT[dt])
            except Exception as e:  # noqa: BLE001
                rows += [_fail_row(_row(pass_=p, flops=fwd_flops, **kw), e) for p in ("fwd", "fwd_bwd")]
                continue
            fwd, fwd_bwd = _attn_fns(q, k, v, go)
            try:
                kw["attn_impl"] = sdpa_impl(fwd)
            except Exception:  # noqa: BLE001 - an unknown backend is a null, never a lost probe
                kw["attn_impl"] = None
            rows.append(_timed(_row(pass_="fwd", flops=fwd_flops, **kw), fwd, device, b.cap_s))
            rows.append(_timed(_row(pass_="fwd_bwd", flops=3.5 * fwd_flops, **kw), fwd_bwd, device, b.cap_s))
    return rows


# --- decode step (vLLM-style generation) ----------------------------------------------------------------------
DECODE_M_GPU = (1, 8, 32, 64, 128, 256, 512)  # tokens in one decode step = running sequences (max_num_seqs)
DECODE_KV_GPU = (512, 2048, 8192, 32768)
DECODE_M_CPU = (1, 8, 32)
DECODE_KV_CPU = (128, 512)


def decode_configs(*, quick: bool, gpu: bool, rng: random.Random) -> tuple[list[tuple[int, int, int]],
                                                                             list[tuple[int, int, int, int, int]]]:
    """GEMM (m, n, k) at decode token counts over the catalog models' tp-1 layer shapes, and decode attention
    (batch, heads, kv_heads, kv_len, head_dim) with the KV cache capped at 4 GiB (GPU) / 64 MiB (CPU) in bf16."""
    ms = DECODE_M_GPU if gpu else DECODE_M_CPU
    kn = [(k, n) for k, n in model_gemm_shapes((1,)) if gpu or k * n <= 1 << 22]  # CPU: a dry run's seconds
    kn = sorted(rng.sample(kn, min(len(kn), (8 if quick else 40) if gpu else 3)))
    if quick:
        ms = ms[::2]
    gemms = [(m, n, k) for k, n in kn for m in ms]
    cap = (4 << 30) if gpu else (64 << 20)
    attn = []
    for batch in ((1, 8, 32, 128) if gpu else (1, 4)):
        for heads, kvh, d in (((32, 8, 128), (64, 8, 128), (16, 16, 64)) if gpu else ((8, 2, 64),)):
            for kv in (DECODE_KV_GPU if gpu else DECODE_KV_CPU):
                if 2 * batch * kvh * kv * d * 2 <= cap:
                    attn.append((batch, heads, kvh, kv, d))
    if quick and len(attn) > 12:
        attn = sorted(rng.sample(attn, 12))
    return gemms, attn


def decode_probes(*, quick: bool, device: torch.device, rng: random.Random, gpu: bool,
                  cap_s: float) -> list[dict[str, Any]]:
    """The kernels of one generation decode step, timed with torch: forward GEMMs at decode m (the running
    sequences) and attention of one new query token per sequence over its cached K/V (op `decode_attention`, as
    the aiconfigurator importer names NVIDIA's measured ones; SDPA, not vLLM's paged kernels: attn_impl says
    which backend ran). A probe that fails is a row."""
    gemms, attn = decode_configs(quick=quick, gpu=gpu, rng=rng)
    dt = "bf16"
    rows: list[dict[str, Any]] = []
    for m, n, k in gemms:
        kw = dict(op="gemm", pass_="fwd", dtype=dt, m=m, n=n, k=k, flops=2.0 * m * n * k)
        try:
            a = torch.randn(m, k, device=device, dtype=DT[dt])
            w = torch.randn(k, n, device=device, dtype=DT[dt])
        except Exception as e:  # noqa: BLE001
            rows.append(_fail_row(_row(**kw), e))
            continue
        rows.append(_timed(_row(**kw), lambda a=a, w=w: a @ w, device, cap_s))
        a = w = None
    for batch, h, kvh, s, d in attn:
        kw = dict(op="decode_attention", pass_="fwd", dtype=dt, batch=batch, heads=h, kv_heads=kvh, seq_len=s,
                  head_dim=d, causal=False, flops=4.0 * batch * h * s * d)
        try:
            q = torch.randn(batch, h, 1, d, device=device, dtype=DT[dt])
            kc = torch.randn(batch, kvh, s, d, device=device, dtype=DT[dt])
            vc = torch.randn(batch, kvh, s, d, device=device, dtype=DT[dt])
        except Exception as e:  # noqa: BLE001
            rows.append(_fail_row(_row(**kw), e))
            continue

        def fwd(q: torch.Tensor = q, kc: torch.Tensor = kc, vc: torch.Tensor = vc) -> torch.Tensor:
            with torch.no_grad():
                return F.scaled_dot_product_attention(q, kc, vc, enable_gqa=q.shape[1] != kc.shape[1])

        try:
            kw["attn_impl"] = sdpa_impl(fwd)
        except Exception:  # noqa: BLE001
            kw["attn_impl"] = None
        rows.append(_timed(_row(**kw), fwd, device, cap_s))
        q = kc = vc = None
    return rows


# --- memory-bound ops --------------------------------------------------------------------------------------------
def _elementwise_fns(x: torch.Tensor, y: torch.Tensor, wt: torch.Tensor,
                     es: int) -> list[tuple[str, Callable[[], object], int, float]]:
    """(op, fn, minimum bytes moved, flops) of the elementwise probes on (rows, hidden) tensors."""
    n = x.numel()

    def rms() -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * wt

    return [("rmsnorm", rms, 2 * n * es, 4.0 * n), ("swiglu", lambda: F.silu(x) * y, 3 * n * es, 5.0 * n),
            ("softmax", lambda: torch.softmax(x, -1), 2 * n * es, 5.0 * n), ("add", lambda: x + y, 3 * n * es, 1.0 * n)]


def _ce_fns(logits: torch.Tensor, tgt: torch.Tensor) -> tuple[Callable[[], object], Callable[[], object]]:
    def ce_fwd() -> torch.Tensor:
        with torch.no_grad():
            return F.cross_entropy(logits.float(), tgt)

    def ce_fwd_bwd() -> None:
        F.cross_entropy(logits.float(), tgt).backward()

    return ce_fwd, ce_fwd_bwd


def memory_probes(b: Budget, device: torch.device) -> list[dict[str, Any]]:
    rows = []
    for dt in b.dtypes:
        es = torch.empty((), dtype=DT[dt]).element_size()
        for numel in b.mem_sizes:
            hidden = 4096 if numel >= 4096 else numel
            rows_n = max(1, numel // hidden)
            try:
                x = torch.randn(rows_n, hidden, device=device, dtype=DT[dt])
                y = torch.randn(rows_n, hidden, device=device, dtype=DT[dt])
                wt = torch.ones(hidden, device=device, dtype=DT[dt])
            except Exception as e:  # noqa: BLE001
                rows.append(_fail_row(_row(op="add", pass_="fwd", dtype=dt, numel=numel), e))
                continue
            n = rows_n * hidden
            for op, fn, nbytes, fl in _elementwise_fns(x, y, wt, es):
                rows.append(_timed(_row(op=op, pass_="fwd", dtype=dt, numel=n, bytes=nbytes, flops=fl), fn,
                                   device, b.cap_s))
            x = y = None
            # Cross-entropy over a full vocabulary (fp32 upcast as TRL does), tokens x vocab ~ numel.
            for vocab in (32000, 128256):
                tokens = max(1, numel // vocab)
                try:
                    logits = torch.randn(tokens, vocab, device=device, dtype=DT[dt], requires_grad=True)
                    tgt = torch.randint(0, vocab, (tokens,), device=device)
                except Exception as e:  # noqa: BLE001
                    rows.append(_fail_row(_row(op="cross_entropy", pass_="fwd", dtype=dt, numel=tokens * vocab), e))
                    continue
                n_ce = tokens * vocab
                ce_fwd, ce_fwd_bwd = _ce_fns(logits, tgt)
                kw = dict(op="cross_entropy", dtype=dt, numel=n_ce, batch=tokens, n=vocab)
                rows.append(_timed(_row(pass_="fwd", bytes=n_ce * (es + 4), flops=4.0 * n_ce, **kw), ce_fwd,
                                   device, b.cap_s))
                rows.append(_timed(_row(pass_="fwd_bwd", bytes=n_ce * (2 * es + 8), flops=8.0 * n_ce, **kw),
                                   ce_fwd_bwd, device, b.cap_s))
                logits = None
        # AdamW over a flat fp32 buffer (master weights are fp32 whatever the compute dtype): read/write param,
        # exp_avg, exp_avg_sq, read grad = 28 bytes per element.
        if dt == "fp32":
            for numel in b.mem_sizes:
                kw = dict(op="adam", pass_="step", dtype="fp32", numel=numel, bytes=28 * numel, flops=12.0 * numel)
                try:
                    p = torch.nn.Parameter(torch.randn(numel, device=device))
                    p.grad = torch.randn(numel, device=device)
                    opt = torch.optim.AdamW([p], lr=1e-4)
                except Exception as e:  # noqa: BLE001
                    rows.append(_fail_row(_row(**kw), e))
                    continue
                rows.append(_timed(_row(**kw), opt.step, device, b.cap_s))
                p = opt = None
    return rows


# --- collectives -------------------------------------------------------------------------------------------------
def comm_probes(b: Budget, *, timeout_s: float = 300.0) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for world in b.comm_worlds:
        with tempfile.TemporaryDirectory(prefix="pp-comm-") as tmp:
            out = Path(tmp) / "rows.json"
            cfg = Path(tmp) / "cfg.json"
            cfg.write_text(json.dumps({"sizes": list(b.comm_sizes), "cap_s": b.comm_cap_s, "out": str(out)}))
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
                   "-m", "perfpredict.collect.probes.comm_probe", "--config", str(cfg)]
            env = dict(os.environ, OMP_NUM_THREADS="1",
                       PYTHONPATH=pythonpath_first(os.environ.get("PYTHONPATH")))
            err = None
            try:
                p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
                if p.returncode != 0:
                    tail = " | ".join(ln for ln in p.stderr.strip().splitlines()[-4:] if "USDT" not in ln)
                    err = f"torchrun exited {p.returncode}: {tail[-300:]}"
            except subprocess.TimeoutExpired:
                err = f"timeout after {timeout_s:g} s"
            if out.exists():
                got = json.loads(out.read_text())
                for r in got:
                    r["oversubscribed"] = not torch.cuda.is_available() and world > fpr.cpu_cores()
                rows += got
            else:
                outcome = "timeout" if err and err.startswith("timeout") else "error"
                rows.append(_row(op="all_reduce", pass_="comm", world_size=world, outcome=outcome, error=err))
    return rows


def probe_rows(*, quick: bool = False, families: tuple[str, ...] = DEFAULT_FAMILIES, seed: int = 0,
               log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The probe suite's rows, without provenance (polars-free: run_probes writes them; a lent GPU machine without
    polars writes them as JSON lines, collect.device)."""
    unknown = [f for f in families if f not in FAMILIES]
    if unknown or not families:
        raise PerfPredictError(f"unknown probe families {unknown or '(none given)'}; known: {', '.join(FAMILIES)}")
    if "trl" in families and len(families) > 1:
        raise PerfPredictError("--families trl runs alone (its rows go to probes-trl.parquet); "
                               "run the generic families in another call")
    gpu = torch.cuda.is_available()
    device = torch.device("cuda") if gpu else torch.device("cpu")
    b = budget(quick=quick, gpu=gpu, devices=torch.cuda.device_count() if gpu else 1, cores=fpr.cpu_cores())
    rng = random.Random(seed)
    threads = torch.get_num_threads()
    if not gpu:
        torch.set_num_threads(1)  # as each training rank runs (1 thread per rank)
    say = log or (lambda s: None)
    rows: list[dict[str, Any]] = []
    try:
        for fam in families:
            t0 = time.perf_counter()
            if fam == "gemm":
                new = gemm_probes(b, device, rng)
            elif fam == "attention":
                new = attention_probes(b, device, rng, gpu)
            elif fam == "memory":
                new = memory_probes(b, device)
            elif fam == "comm":
                new = comm_probes(b)
            elif fam == "decode":
                new = decode_probes(quick=quick, device=device, rng=rng, gpu=gpu, cap_s=b.cap_s)
            elif fam == "trl":
                new = trl_op_probes(quick=quick, device=device, cap_s=b.cap_s, timed=_timed, row=_row,
                                    fail=_fail_row)
            else:
                raise ValueError(fam)
            for r in new:
                r.setdefault("threads", 1 if not gpu or fam == "comm" else None)
            say(f"{fam}: {len(new)} rows in {time.perf_counter() - t0:.1f} s")
            rows += new
    finally:
        torch.set_num_threads(threads)
    for r in rows:
        r.setdefault("world_size", 1)
        r["suite"] = "quick" if quick else "full"
    return rows


def run_probes(*, quick: bool = False, out_dir: Path | str | None = None, command: str | None = None,
               families: tuple[str, ...] = DEFAULT_FAMILIES, seed: int = 0,
               log: Callable[[str], None] | None = None) -> tuple[Path, pl.DataFrame]:
    """Run the probe suite and append its rows to <out_dir>/probes.parquet (the trl family alone: to
    probes-trl.parquet); returns the path and the new rows."""
    from perfpredict.collect import store
    from perfpredict.core.dataset import append_rows

    rows = probe_rows(quick=quick, families=families, seed=seed, log=log)
    prov = fpr.provenance(command or shlex.join(["perfpredict", "collect", "probes"] + (["--quick"] if quick else [])))
    for r in rows:
        r.update(prov)
    out = Path(out_dir) if out_dir else default_out()
    path = out / ("probes-trl.parquet" if families == ("trl",) else "probes.parquet")
    return path, append_rows(path, rows, store.probes_schema())


__all__ = ["budget", "probe_rows", "run_probes", "decode_probes", "gemm_probes", "attention_probes", "memory_probes", "comm_probes",
           "model_gemm_shapes"]
