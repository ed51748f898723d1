"""Kernel times looked up in measured GPU silicon (NVIDIA AIConfigurator's database, datasets/public/aiconfigurator/):
GEMMs by (m, n, k), decode attention by (batch, KV length), prefill attention by (batch, prompt length), the fused
MoE layer by (tokens, shape, TP, EP), vLLM's custom all-reduce and NCCL by (GPUs, bytes).

Lookup is interpolation in log space on the measured grid (times grow smoothly in every size on a log scale);
outside the grid a time scales with the work (a GEMM's n x k, attention's batch x KV length, a message's bytes),
never below the grid's edge. Each table holds what one GPU type measured; `SiliconKernels.for_gpu` returns None for
a GPU the database does not hold, and the caller says so and falls back to the roofline composition.

The tables are the normalised ones the aiconfigurator importer commits (columns: hardware = catalog GPU name,
time_s, and each family's shape columns); `load_tables` reads them from the checkout's datasets/ folder."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
from scipy.interpolate import RegularGridInterpolator

REPO_DATASETS = Path(__file__).resolve().parents[3] / "datasets"
SILICON_DIR = Path("public") / "aiconfigurator"
# Weight formats of the GEMM table; a checkpoint's precision maps onto one.
GEMM_DTYPES = {"bf16": "bfloat16", "fp16": "bfloat16", "fp32": "bfloat16", "fp8": "fp8", "fp8_block": "fp8_block"}


def _memo(fn):
    """Per-instance memo of a method (functools.cache on a method would keep every instance alive)."""

    @functools.wraps(fn)
    def wrapper(self, *args):
        key = (fn.__name__, *args)
        if key not in self._memo:
            self._memo[key] = fn(self, *args)
        return self._memo[key]

    return wrapper


class _Grid:
    """log(time) on a regular log grid, holes filled along the first axis by proportional scaling from the nearest
    measured point (times there grow ~linearly with that size: tokens, batch)."""

    def __init__(self, axes: list[np.ndarray], values: np.ndarray):
        v = values.copy()
        self._fill(axes, v)
        if not np.isfinite(v).all():
            v = self._nearest(v)
        # Less work is never slower: along every axis (tokens, width, batch, KV length, bytes) a smaller size takes
        # at most the time of a larger one (it could be padded to it). Measured neighbours break this by noise, and
        # a slow outlier at a small size (a poor kernel pick) would otherwise lift every larger size if fixed the
        # other way round.
        for d in range(v.ndim):
            v = np.flip(np.minimum.accumulate(np.flip(v, axis=d), axis=d), axis=d)
        self.axes = axes
        self.lo = [a[0] for a in axes]
        self.hi = [a[-1] for a in axes]
        self.f = RegularGridInterpolator([np.log(a) for a in axes], np.log(v), bounds_error=False, fill_value=None)

    @staticmethod
    def _nearest(v: np.ndarray) -> np.ndarray:
        """Still-missing cells (a whole line unmeasured): the nearest measured cell."""
        from scipy.ndimage import distance_transform_edt

        _, ind = distance_transform_edt(~np.isfinite(v), return_indices=True)
        return v[tuple(ind)]

    @staticmethod
    def _fill(axes: list[np.ndarray], v: np.ndarray) -> None:
        a0 = axes[0]
        flat = v.reshape(len(a0), -1)
        for j in range(flat.shape[1]):
            col = flat[:, j]
            ok = np.isfinite(col)
            if ok.all() or not ok.any():
                continue
            idx = np.flatnonzero(ok)
            for i in np.flatnonzero(~ok):
                near = idx[np.argmin(np.abs(idx - i))]
                col[i] = col[near] * max(a0[i] / a0[near], 1.0 if i > near else a0[i] / a0[near])
            flat[:, j] = col

    def __call__(self, *xs, scale_axes: tuple[int, ...] = ()) -> np.ndarray:
        """Time at the points; beyond the grid on a `scale_axes` axis the edge time grows in proportion."""
        xs = [np.atleast_1d(np.asarray(x, dtype=float)) for x in xs]
        xs = np.broadcast_arrays(*xs)
        factor = np.ones_like(xs[0])
        q = []
        for d, x in enumerate(xs):
            c = np.clip(x, self.lo[d], self.hi[d])
            if d in scale_axes:
                factor = factor * np.maximum(x / self.hi[d], 1.0)
            q.append(np.log(c))
        return np.exp(self.f(np.stack(q, axis=-1))) * factor


@dataclass(frozen=True)
class _Pivot:
    keys: tuple
    grid: _Grid


def _pivot(df: pl.DataFrame, axes: list[str]) -> _Grid:
    vals = [np.array(sorted(df[a].unique().to_list()), dtype=float) for a in axes]
    arr = np.full([len(v) for v in vals], np.nan)
    idx = [np.searchsorted(v, df[a].to_numpy().astype(float)) for v, a in zip(vals, axes, strict=True)]
    arr[tuple(idx)] = df["time_s"].to_numpy()
    # A single value on an axis cannot be interpolated: duplicate it a decade up so the grid stays regular.
    for d, v in enumerate(vals):
        if len(v) == 1:
            vals[d] = np.array([v[0], v[0] * 10 + 1])
            arr = np.concatenate([arr, arr], axis=d)
    return _Grid(vals, arr)


class SiliconKernels:
    """Measured kernel times of one GPU type, in seconds."""

    def __init__(self, hardware: str, tables: dict[str, pl.DataFrame]):
        self.hardware = hardware
        self._memo: dict[tuple, object] = {}
        self.t = {k: v.filter(pl.col("hardware") == hardware) for k, v in tables.items()}
        self.version = ""
        if "gemm" in self.t and "version" in self.t["gemm"].columns and self.t["gemm"].height:
            self.version = str(self.t["gemm"]["version"][0])

    @classmethod
    def for_gpu(cls, hardware: str, root: Path | str | None = None) -> SiliconKernels | None:
        if hardware not in covered_gpus(root):
            return None
        return _cached(hardware, root)

    # --- GEMM ---------------------------------------------------------------------------------------------------
    @_memo
    def _gemm_grid(self, dtype: str) -> _Grid:
        g = self.t["gemm"].filter(pl.col("dtype") == dtype)
        if g.height == 0:
            g = self.t["gemm"].filter(pl.col("dtype") == "bfloat16")
        # Several kernels were timed for some formats; vLLM picks the fastest that applies.
        g = g.group_by("m", "n", "k").agg(pl.col("time_s").min())
        return _pivot(g, ["m", "n", "k"])

    def gemm(self, m, n: int, k: int, dtype: str = "bfloat16") -> np.ndarray:
        # fp8_block GEMMs are not imported (importers.aiconfigurator: slower than bf16 at decode sizes), so block-FP8
        # checkpoints take the bf16 GEMM (_gemm_grid's fallback).
        return self._gemm_grid(dtype)(m, n, k, scale_axes=(0, 1, 2))

    # --- attention ----------------------------------------------------------------------------------------------
    def _heads_match(self, df: pl.DataFrame, heads: int, kv_heads: int, head_dim: int) -> tuple[pl.DataFrame, float]:
        """Rows of the measured (heads, kv_heads) closest to the query's, and the factor for the difference (time
        grows with the heads read: KV heads in decode, query heads in prefill)."""
        d = df.filter(pl.col("head_dim") == head_dim)
        if d.height == 0:
            dims = np.array(sorted(df["head_dim"].unique().to_list()))
            hd = int(dims[np.argmin(np.abs(np.log(dims / head_dim)))])
            d = df.filter(pl.col("head_dim") == hd)
            extra = head_dim / hd
        else:
            extra = 1.0
        pairs = d.select("heads", "kv_heads").unique().sort("heads", "kv_heads")
        hv, kv = pairs["heads"].to_numpy(), pairs["kv_heads"].to_numpy()
        cost = np.abs(np.log(hv / heads)) + 2 * np.abs(np.log(kv / kv_heads))
        i = int(np.argmin(cost))
        h0, k0 = int(hv[i]), int(kv[i])
        return d.filter((pl.col("heads") == h0) & (pl.col("kv_heads") == k0)), extra * (heads / h0) ** 0.5 * (
            kv_heads / k0) ** 0.5

    @_memo
    def _decode_grid(self, heads: int, kv_heads: int, head_dim: int, kv_dtype: str) -> tuple[_Grid, float]:
        g = self.t["gen_attn"].filter((pl.col("window") == 0) & (pl.col("kv_dtype") == kv_dtype))
        if g.height == 0:
            g = self.t["gen_attn"].filter(pl.col("window") == 0)
        g, f = self._heads_match(g, heads, kv_heads, head_dim)
        g = g.group_by("batch", "step").agg(pl.col("time_s").min())
        return _pivot(g, ["batch", "step"]), f

    def decode_attention(self, batch, ctx, *, heads: int, kv_heads: int, head_dim: int,
                         kv_dtype: str = "bfloat16") -> np.ndarray:
        grid, f = self._decode_grid(heads, kv_heads, head_dim, kv_dtype)
        return grid(np.maximum(batch, 1), np.maximum(ctx, 1), scale_axes=(0, 1)) * f

    @_memo
    def _prefill_grid(self, heads: int, kv_heads: int, head_dim: int) -> tuple[_Grid, float]:
        g = self.t["ctx_attn"].filter((pl.col("window") == 0) & (pl.col("kv_dtype") == "bfloat16"))
        g, f = self._heads_match(g, heads, kv_heads, head_dim)
        g = g.group_by("batch", "isl").agg(pl.col("time_s").min())
        return _pivot(g, ["batch", "isl"]), f

    def prefill_attention(self, batch, isl, *, heads: int, kv_heads: int, head_dim: int) -> np.ndarray:
        """Causal attention over `batch` prompts of `isl` tokens (beyond the grid: batch linearly, isl squared)."""
        grid, f = self._prefill_grid(heads, kv_heads, head_dim)
        isl = np.asarray(isl, dtype=float)
        over = np.maximum(isl / grid.hi[1], 1.0)
        return grid(np.maximum(batch, 1), np.maximum(isl, 1), scale_axes=(0,)) * f * over ** 2

    # --- MoE ----------------------------------------------------------------------------------------------------
    @_memo
    def _moe_grid(self, dtype: str, hidden: int, inter: int, topk: int, experts: int, tp: int,
                  ep: int) -> tuple[_Grid, float] | None:
        m = self.t["moe"]
        if "distribution" in m.columns:
            # Dummy weights route unevenly (the source's caveat); AIConfigurator's default workload is a power
            # law of exponent 1.01, which real routers come close to.
            dist = "power_law_1.01" if (m["distribution"] == "power_law_1.01").any() else "balanced"
            m = m.filter(pl.col("distribution") == dist)
        # Sorted: polars' unique() returns rows in no fixed order, and a tie in the nearest-shape cost below would
        # otherwise pick a different kernel from one process to the next.
        shapes = m.select("dtype", "hidden", "inter", "topk", "experts").unique().sort(
            "dtype", "hidden", "inter", "topk", "experts")
        if shapes.height == 0:
            return None
        # The stated format's own kernels first: per-tensor FP8 and block FP8 run different expert kernels (a run
        # stated as fp8 on a shape only measured as fp8_block would otherwise take the block kernel, 1.4x faster
        # than its measured TPOT on the H200).
        if (shapes["dtype"] == dtype).any():
            shapes = shapes.filter(pl.col("dtype") == dtype)
        # The measured MoE shape nearest the query (where its format has no rows: another FP8 format before bf16),
        # scaled by the work ratio (tokens x topk x hidden x inter per rank).
        work = (shapes["hidden"] * shapes["inter"] * shapes["topk"]).to_numpy().astype(float)
        fam = np.array([str(x).startswith("fp8") for x in shapes["dtype"].to_list()])
        same = (shapes["dtype"] == dtype).to_numpy()
        cost = (np.abs(np.log(work / (hidden * inter * topk))) + 0.5 * np.abs(
            np.log(shapes["experts"].to_numpy() / experts)) + np.where(same, 0.0, np.where(
                fam == dtype.startswith("fp8"), 0.1, 0.6)))
        i = int(np.argmin(cost))
        s = shapes.row(i, named=True)
        c = m.filter((pl.col("dtype") == s["dtype"]) & (pl.col("hidden") == s["hidden"]) &
                     (pl.col("inter") == s["inter"]) & (pl.col("topk") == s["topk"]) &
                     (pl.col("experts") == s["experts"]))
        par = c.select("moe_tp", "moe_ep").unique().sort("moe_tp", "moe_ep")
        pc = np.abs(np.log(par["moe_tp"].to_numpy() / tp)) + np.abs(np.log(par["moe_ep"].to_numpy() / ep))
        j = int(np.argmin(pc))
        t0, e0 = int(par["moe_tp"][j]), int(par["moe_ep"][j])
        c = c.filter((pl.col("moe_tp") == t0) & (pl.col("moe_ep") == e0)).group_by("tokens").agg(
            pl.col("time_s").min())
        f = (hidden * inter * topk) / (s["hidden"] * s["inter"] * s["topk"]) * (t0 * e0) / (tp * ep)
        return _pivot(c, ["tokens"]), f

    def moe(self, tokens, *, hidden: int, inter: int, topk: int, experts: int, tp: int, ep: int,
            dtype: str = "bfloat16") -> np.ndarray:
        """The fused MoE layer per GPU of a moe_tp x moe_ep group. An FP8 checkpoint takes the faster of its
        format's measured kernel and the bf16 one: the per-tensor FP8 rows (FlashInfer CUTLASS) are up to 2.5x
        slower on Hopper than bf16 at decode sizes, where vLLM would pick another backend; block-FP8 checkpoints
        (dtype fp8_block) read their own rows (Triton / CUTLASS block-scaled experts, ~0.6x bf16 on the H100)."""
        toks = np.maximum(np.atleast_1d(np.asarray(tokens, dtype=float)), 1)
        out = np.full(toks.shape, np.inf)
        for dt in ({dtype, "bfloat16"} if dtype.startswith("fp8") else {dtype}):
            r = self._moe_grid(dt, hidden, inter, topk, experts, tp, ep)
            if r is not None:
                grid, f = r
                out = np.minimum(out, grid(toks, scale_axes=(0,)) * f)
        return np.where(np.isfinite(out), out, np.nan)

    # --- collectives --------------------------------------------------------------------------------------------
    @_memo
    def _comm_grid(self, family: str, op: str, gpus: int) -> _Grid | None:
        t = self.t.get(family)
        if t is None or t.height == 0:
            return None
        if "op" in t.columns:
            t = t.filter(pl.col("op") == op)
        if "backend" in t.columns and family == "allreduce":
            t = t.filter(pl.col("backend").str.contains("graph"))
        if "dtype" in t.columns and family == "nccl":
            t = t.filter(pl.col("dtype") == "half")
        ws = sorted(t["gpus"].unique().to_list())
        if not ws:
            return None
        w = min(ws, key=lambda x: (abs(math.log(x / gpus)), -x))
        t = t.filter(pl.col("gpus") == w).group_by("bytes").agg(pl.col("time_s").min())
        return _pivot(t, ["bytes"])

    def all_reduce(self, nbytes, gpus: int) -> np.ndarray:
        """vLLM's TP all-reduce: its custom kernel (CUDA-graph mode) up to the sizes it was measured at, NCCL
        above (vLLM's CustomAllreduce.should_custom_ar refuses buffers above its max_size and falls back)."""
        nbytes = np.atleast_1d(np.asarray(nbytes, dtype=float))
        if gpus <= 1:
            return np.zeros_like(nbytes)
        ar = self._comm_grid("allreduce", "all_reduce", gpus)
        nc = self._comm_grid("nccl", "all_reduce", gpus)
        out = nc(nbytes, scale_axes=(0,)) if nc is not None else np.full_like(nbytes, np.nan)
        if ar is not None:
            inside = nbytes <= ar.hi[0]
            out = np.where(inside, ar(nbytes, scale_axes=(0,)), out)
        return out

    def send(self, nbytes) -> np.ndarray:
        """A pipeline stage's send of activations to the next (NCCL point-to-point inside a node). No send/recv
        was measured; a 2-GPU all-gather of twice the bytes moves the same bytes each way over the same link."""
        g = self._comm_grid("nccl", "all_gather", 2)
        nbytes = np.atleast_1d(np.asarray(nbytes, dtype=float))
        return g(2 * nbytes, scale_axes=(0,)) if g is not None else np.full_like(nbytes, np.nan)


@functools.cache
def _cached(hardware: str, root: Path | str | None) -> SiliconKernels:
    return SiliconKernels(hardware, load_tables(root))


# The importer's files (perfpredict.importers.aiconfigurator) -> the columns this module reads.
_TABLES = {
    "gemm": ("probes_gemm.parquet", {"runtime_version": "version", "gemm_dtype": "dtype", "m": "m", "n": "n",
                                     "k": "k"}),
    "gen_attn": ("probes_generation_attention.parquet", {"batch": "batch", "heads": "heads", "kv_heads": "kv_heads",
                                                         "head_dim": "head_dim", "kv_cache_dtype": "kv_dtype",
                                                         "window_size": "window", "step": "step"}),
    "ctx_attn": ("probes_context_attention.parquet", {"batch": "batch", "isl": "isl", "heads": "heads",
                                                      "kv_heads": "kv_heads", "head_dim": "head_dim",
                                                      "kv_cache_dtype": "kv_dtype", "window_size": "window"}),
    "moe": ("probes_moe.parquet", {"moe_dtype": "dtype", "num_tokens": "tokens", "hidden_size": "hidden",
                                   "inter_size": "inter", "topk": "topk", "num_experts": "experts",
                                   "moe_tp_size": "moe_tp", "moe_ep_size": "moe_ep", "distribution": "distribution"}),
    "allreduce": ("probes_custom_allreduce.parquet", {"world_size": "gpus", "bytes": "bytes", "backend": "backend"}),
    "nccl": ("probes_nccl.parquet", {"op": "op", "nccl_dtype": "dtype", "world_size": "gpus", "bytes": "bytes"}),
}


# Block-FP8 experts (the importer keeps them out of probes*.parquet): block-quantised checkpoints run them.
BLOCK_FP8_FILES = {"moe": "fp8_block_moe.parquet"}


@functools.cache
def load_tables(root: Path | str | None = None) -> dict[str, pl.DataFrame]:
    """The silicon tables by family (gemm, gen_attn, ctx_attn, moe, allreduce, nccl) from
    <root>/public/aiconfigurator/probes_*.parquet (root: the checkout's datasets/); empty when there are none."""
    base = Path(root or REPO_DATASETS) / SILICON_DIR
    out = {}
    for fam, (fname, cols) in _TABLES.items():
        f = base / fname
        if not f.is_file():
            continue
        # A family's block-FP8 table is an addition to its main table, read only where the main one exists.
        extra = [base / BLOCK_FP8_FILES[fam]] if fam in BLOCK_FP8_FILES else []
        out[fam] = pl.concat([
            pl.read_parquet(path, columns=["hardware", "outcome", "time_s", *cols])
            .filter(pl.col("outcome") == "ok")
            .select("hardware", *[pl.col(a).alias(b) for a, b in cols.items()], "time_s")
            for path in (f, *extra) if path.is_file()])
    return out


@functools.cache
def covered_gpus(root: Path | str | None = None) -> frozenset[str]:
    t = load_tables(root)
    need = ("gemm", "gen_attn", "ctx_attn")
    if not all(k in t for k in need):
        return frozenset()
    s = set(t["gemm"]["hardware"].unique().to_list())
    for k in need[1:]:
        s &= set(t[k]["hardware"].unique().to_list())
    return frozenset(s)
