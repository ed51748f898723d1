"""Kernel-level models: GEMM, attention, memory-bound ops and collectives.

Each family predicts log(measured time / roofline time), where the roofline comes from the hardware's datasheet
figures. Learning the efficiency rather than the time lets a GPU with few probes borrow from the others: its
roofline already carries its peak rates, and the model only learns how far below them a shape runs."""

from __future__ import annotations

import numpy as np
import polars as pl

from perfpredict.core.schema import TRL_OPS
from perfpredict.models.gb import GBRegressor
from perfpredict.models.hardware_frame import with_hardware

c = pl.col
FAMILIES = ("gemm", "attention", "membound", "collective")
MEMBOUND_OPS = ("rmsnorm", "layernorm", "swiglu", "gelu", "softmax", "cross_entropy", "add", "adam", "copy")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}
PASSES = ("fwd", "bwd_input", "bwd_weight", "fwd_bwd", "bwd", "step", "comm")
# Bytes each membound op moves per element of its main tensor (reads + writes, 16-bit), as implemented unfused.
MEMBOUND_TRAFFIC = {"rmsnorm": 2.0, "layernorm": 2.0, "swiglu": 3.0, "gelu": 2.0, "softmax": 2.0,
                    "cross_entropy": 3.0, "add": 3.0, "adam": 8.0, "copy": 2.0}


def family_of(op: str) -> str:
    if op == "gemm":
        return "gemm"
    if op == "attention":
        return "attention"
    if op in COLLECTIVES:
        return "collective"
    return "membound"


def _peak_tflops() -> pl.Expr:
    return (pl.when(c("dtype") == "fp32").then(c("hw_fp32_tflops"))
            .when(c("dtype") == "fp8").then(c("hw_fp8_tflops"))
            .when(c("dtype") == "fp16").then(c("hw_fp16_tflops"))
            .otherwise(c("hw_bf16_tflops")))


def _algo_factor() -> pl.Expr:
    """Bytes through each rank's link per buffer byte (the nccl-tests bus-bandwidth factors of a ring)."""
    n = c("world_size").cast(pl.Float64)
    return (pl.when(c("op") == "all_reduce").then(2.0 * (n - 1.0) / n)
            .when(c("op").is_in(["all_gather", "reduce_scatter", "all_to_all"])).then((n - 1.0) / n)
            .otherwise(1.0))


def roofline(df: pl.DataFrame) -> pl.DataFrame:
    """Adds `roof_s` (datasheet lower bound on time) and the shape features every family uses."""
    df = with_hardware(df)
    dbytes = c("dtype").replace_strict(DTYPE_BYTES, default=2, return_dtype=pl.Float64)
    m, n, k = (c(x).cast(pl.Float64) for x in ("m", "n", "k"))
    gemm_flops = 2.0 * m * n * k
    gemm_bytes = dbytes * (m * k + k * n + m * n)
    b, a, kv, s, hd = (c(x).cast(pl.Float64) for x in ("batch", "heads", "kv_heads", "seq_len", "head_dim"))
    # QK^T and AV: 4*b*a*s^2*hd FLOPs forward, half of it under a causal mask. Some published attention rows
    # (Azure's) are non-causal, so the mask is a probe column; our composition always asks for causal.
    causal = c("causal").fill_null(True) if "causal" in df.columns else pl.lit(True)
    attn_fwd = pl.when(causal).then(2.0).otherwise(4.0) * b * a * s * s * hd
    attn_flops = pl.when(c("pass_") == "fwd").then(attn_fwd).otherwise(3.5 * attn_fwd)
    attn_bytes = dbytes * b * s * hd * (2.0 * a + 2.0 * kv) * pl.when(c("pass_") == "fwd").then(1.0).otherwise(2.5)
    traffic = c("op").replace_strict(MEMBOUND_TRAFFIC, default=2.0, return_dtype=pl.Float64)
    mem_bytes = pl.coalesce(c("bytes").cast(pl.Float64), c("numel").cast(pl.Float64) * dbytes * traffic)
    peak = _peak_tflops() * 1e12
    hbm = c("hw_hbm_tb_per_s") * 1e12
    cross = c("ranks_per_node").fill_null(c("world_size")) < c("world_size")
    # The link a collective crosses: the cluster's own figure when the query carries one (a user's override of
    # intra-/inter-node bandwidth), the catalog's datasheet figure otherwise (probes measured on that hardware).
    catalog_link = pl.when(cross).then(c("hw_inter_gb_per_s")).otherwise(c("hw_intra_gb_per_s"))
    link_col = c("link_gb_per_s").cast(pl.Float64) if "link_gb_per_s" in df.columns else pl.lit(None, pl.Float64)
    link = pl.coalesce(link_col, catalog_link) * 1e9
    coll_bytes = c("bytes").cast(pl.Float64) * _algo_factor()
    fam = c("family")
    flops = (pl.when(fam == "gemm").then(gemm_flops).when(fam == "attention").then(attn_flops).otherwise(0.0))
    moved = (pl.when(fam == "gemm").then(gemm_bytes).when(fam == "attention").then(attn_bytes)
             .when(fam == "membound").then(mem_bytes).otherwise(coll_bytes))
    roof = (pl.when(fam == "collective").then(moved / link)
            .otherwise(pl.max_horizontal(flops / peak, moved / hbm)))
    return df.with_columns(k_flops=flops, k_bytes=moved, k_cross_node=cross).with_columns(
        roof_s=pl.max_horizontal(roof, pl.lit(1e-9)))


ATTN_IMPLS = ("flash2", "flash3", "cudnn", "efficient", "math", "sdpa-cpu")
# A collective's efficiency is learned against its bandwidth roofline from features that do not contain the link
# rate itself: the predicted time then scales exactly with 1/bandwidth, so a user's faster link is never slower
# (a tree given log(link) or log(roof) learned to cancel them, and predicted TP-8 faster at 8 GB/s than at 300).
COLLECTIVE_FEATURES = ("f_log_bytes", "f_world", "f_cross", "f_is_cpu", "f_op", "f_log_sms", "f_rpn")


def kernel_features(df: pl.DataFrame, family: str | None = None) -> pl.DataFrame:
    """Numeric features for one family's rows (after roofline)."""
    f = _all_features(df)
    if family is not None and family.removesuffix(".cpu") == "collective":
        return f.select(COLLECTIVE_FEATURES)
    return f.drop("f_rpn")


def _all_features(df: pl.DataFrame) -> pl.DataFrame:
    log = lambda e: (e.cast(pl.Float64).fill_null(0.0) + 1.0).log10()  # noqa: E731
    peak = _peak_tflops()
    causal = c("causal").fill_null(True) if "causal" in df.columns else pl.lit(True)
    impl = c("attn_impl") if "attn_impl" in df.columns else pl.lit(None, pl.Utf8)
    return df.select(
        f_log_roof=c("roof_s").log10(),
        f_log_flops=log(c("k_flops")),
        f_log_bytes=log(c("k_bytes")),
        f_intensity=log(c("k_flops") / (c("k_bytes") + 1.0)),
        f_balance=(peak * 1e12 / (c("hw_hbm_tb_per_s") * 1e12)).log10(),
        f_log_peak=peak.log10(),
        f_log_hbm=c("hw_hbm_tb_per_s").log10(),
        f_log_m=log(c("m")), f_log_n=log(c("n")), f_log_k=log(c("k")),
        f_log_batch=log(c("batch")), f_heads=c("heads").cast(pl.Float64).fill_null(0.0),
        f_gqa=(c("heads").cast(pl.Float64) / c("kv_heads")).fill_null(1.0),
        f_log_seq=log(c("seq_len")), f_head_dim=c("head_dim").cast(pl.Float64).fill_null(0.0),
        f_log_numel=log(c("numel")),
        f_world=c("world_size").cast(pl.Float64).fill_null(1.0),
        f_cross=c("k_cross_node").cast(pl.Float64).fill_null(0.0),
        f_log_link=(pl.when(c("k_cross_node")).then(c("hw_inter_gb_per_s")).otherwise(c("hw_intra_gb_per_s"))).log10(),
        f_is_cpu=c("hw_is_cpu").cast(pl.Float64),
        f_dtype=c("dtype").replace_strict(DTYPE_BYTES, default=2, return_dtype=pl.Float64),
        f_pass=c("pass_").replace_strict({p: i for i, p in enumerate(PASSES)}, default=0, return_dtype=pl.Float64),
        f_op=c("op").replace_strict({o: i for i, o in enumerate(MEMBOUND_OPS + COLLECTIVES)}, default=-1,
                                    return_dtype=pl.Float64),
        f_log_sms=log(c("hw_sms")),
        f_causal=causal.cast(pl.Float64),
        f_impl=impl.replace_strict({m: float(i) for i, m in enumerate(ATTN_IMPLS)}, default=-1.0,
                                   return_dtype=pl.Float64),
        f_rpn=c("ranks_per_node").cast(pl.Float64).fill_null(c("world_size").cast(pl.Float64)).fill_null(1.0),
    )


XGB_PARAMS = dict(n_estimators=300, max_depth=6, learning_rate=0.06, subsample=0.9, colsample_bytree=0.9,
                  min_child_weight=2.0, reg_lambda=1.0, tree_method="hist", n_jobs=2)


class KernelModel:
    """One xgboost regressor per family on log10(time / roofline). scikit-learn contract."""

    def __init__(self, *, seed: int = 0, params: dict | None = None):
        self.seed = seed
        self.params = params

    def prepare(self, probes: pl.DataFrame) -> pl.DataFrame:
        if "family" not in probes.columns:
            probes = probes.with_columns(family=c("op").map_elements(family_of, return_dtype=pl.Utf8))
        return roofline(probes)

    @staticmethod
    def _keys(df: pl.DataFrame) -> np.ndarray:
        """Model key per row: the family, with CPUs apart. CPU kernels behave nothing like GPU ones, and mixing
        them cost GPU extrapolation dearly (held-out A100 GEMMs: 31% median error with CPU probes in the
        training set, 7.5% without)."""
        fam = df["family"].to_numpy().astype(object)
        cpu = df["hw_is_cpu"].to_numpy().astype(bool)
        return np.where(cpu, fam + ".cpu", fam)

    def fit(self, probes: pl.DataFrame) -> KernelModel:
        # The trl family's probes time whole TRL ops against these models (models.trl_scales); none learns from them.
        probes = probes.filter(~c("op").is_in(list(TRL_OPS)))
        df = self.prepare(probes.filter((c("outcome").fill_null("ok") == "ok") & (c("time_s") > 0)))
        self.models_ = {}
        self.feature_names_ = {}
        self.families_ = {}
        keys = self._keys(df)
        for key in sorted(set(keys)):
            sub = df.filter(pl.Series(keys == key))
            if sub.height < 5:
                continue
            X = kernel_features(sub, key).to_numpy()
            self.feature_names_[key] = kernel_features(sub.head(1), key).columns
            y = np.log10(sub["time_s"].to_numpy() / sub["roof_s"].to_numpy())
            self.models_[key] = GBRegressor(seed=self.seed, **(self.params or XGB_PARAMS)).fit(X, y)
            self.families_[key] = {"rows": sub.height, "hardware": sorted(sub["hardware"].unique().to_list())}
        return self

    def predict_prepared(self, df: pl.DataFrame) -> np.ndarray:
        """Seconds for rows that already went through prepare(). A CPU family without CPU probes falls back to
        the GPU model of the family; a family without any model gets twice the roofline."""
        out = np.empty(df.height)
        keys = self._keys(df)
        roof = df["roof_s"].to_numpy()
        for key in np.unique(keys):
            idx = keys == key
            name = key if key in self.models_ else key.removesuffix(".cpu")
            model = self.models_.get(name)
            if model is None:
                out[idx] = roof[idx] * 2.0
                continue
            X = kernel_features(df.filter(pl.Series(idx)), name).to_numpy()
            ratio = 10.0 ** model.predict(X)
            out[idx] = roof[idx] * ratio
        return out

    def predict(self, probes: pl.DataFrame) -> np.ndarray:
        return self.predict_prepared(self.prepare(probes))
