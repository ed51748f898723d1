"""Plan-level corrections: learn what the kernel composition (time) and the analytic model (memory) miss, without
running away outside the data they were learned on.

- time: log10(measured step / composed step); memory: log10(measured peak / analytic peak).
- Features are scale-free (shares of the canonical plan's composed step, tokens and arithmetic intensity per
  micro-batch, parallel degrees, plan switches) rather than absolute sizes and counts, which acted as source
  identifiers and let a tree carry one source's ratio to runs 100x larger.
- The output is bounded (the training targets' range) and shrunk towards 0 (the composition / analytic) by an
  applicability-domain weight: 1 near the training rows in feature space, 0 from twice the distance that 95 % of
  training rows have to their own neighbours, and 0 for a (framework family, hardware) pair never measured.
- Intervals are split-conformal per domain from out-of-fold residuals, blended with the composition's own residual
  spread, in the row's domain or the nearest measured ones, as the weight falls ("outside what was measured").
- fits: models.oom, from the memory interval, the reserve outside the allocator and a per-cell calibrated margin."""

from __future__ import annotations

import weakref

import numpy as np
import polars as pl

from perfpredict.core.catalog import cpu_names
from perfpredict.core.frameworks import FAMILY, TRL_FRAMEWORKS
from perfpredict.features.compute import on_cpu
from perfpredict.models.gb import GBRegressor
from perfpredict.models.neighbours import Neighbours

c = pl.col
FRAMEWORK_CODES = ("megatron", "deepspeed", "fsdp", "nanotron")
# Frameworks the corrections are neither learned on nor applied to (their domain stays unseen, weight 0): TRL's
# prediction is the composition with TRL's own terms and the analytic TRL memory model. On TRL runs held out by
# shape (validation folds, trl-shape) the correction made both worse: step time 19.3 % vs 16.2 % composed, peak
# memory 4.2 % vs 3.0 %.
UNCORRECTED = TRL_FRAMEWORKS
# Frameworks of one family (core.frameworks FAMILY: Capability.family) share a domain; TRL's trainers
# (features.trl) form their own family, so their intervals are their own.
RECOMPUTE_CODES = {"none": 0.0, "selective": 1.0, "full": 2.0}
# Per-step reference cost: none = precomputed (its forward ran before training) < live < offloaded (streamed in).
REFERENCE_CODES = {"none": 0.0, "precomputed": 0.0, "live": 1.0, "offloaded": 2.0}
SCHEDULE_CODES = {"1f1b": 0.0, "gpipe": 1.0, "interleaved": 2.0}
SHARE_PARTS = ("compute", "tp", "pp", "cp", "ep", "dp", "zero3", "optim", "launch")
# The correction may only rise with these (the composition already rises with them): more micro-batches per step,
# more recompute, a costlier reference can never make a step faster.
TIME_MONOTONE = {"f_log_ga": 1, "f_recompute": 1, "f_reference": 1}
# The guard that a learned correction never reverses what the composition orders for a plan and its physics twin
# (the same plan with a live instead of a precomputed reference, with recompute, with more micro-batches; more
# bandwidth is outside the features altogether, canonical_frame): the correction is t = k x 10^(w x r).
# - r, the log ratio, is non-decreasing in the twin's one differing feature (xgboost's monotone constraints,
#   TIME_MONOTONE), the other features being the canonical plan's (compose.canonical_frame);
# - w, the applicability weight, is measured without those features (Correction.domain_features_), so twins share
#   it: with w the same, w x r keeps r's order whatever its sign, and the composition's k orders the twins.
# With the knobs in the distance, a live reference sat farther from the (mostly precomputed) training rows than its
# precomputed twin, its positive correction was shrunk more, and 1B FSDP2 tp4 on 8 A100 predicted 7.53 s live
# against 7.83 s precomputed (composed 6.54 against 4.80 s). This is structural, for every bundle this code fits;
# a clamp of the corrected times to the composition's order would need each twin predicted beside each plan (a
# ranking would pay for every knob) and would hide a correction that disagrees with physics instead of preventing it.
PHYSICS_KNOBS = {"time": tuple(TIME_MONOTONE), "memory": ()}
K_NEIGHBOURS = 5
# A domain measured on fewer rows than this gets no correction (the composition alone, and the interval of the
# nearest measured domains): a ratio learned from one or two runs of another model is an anecdote. With each source
# weighing the same in the fit, ms-swift's 3 DeepSpeed rows on A100 moved a held-out model's step 3.7 % -> 11.6 %
# off, the only folds where the learned step time was worse than the composition (model, width, scale).
MIN_DOMAIN_ROWS = 10


def _log(e: pl.Expr) -> pl.Expr:
    return (e.cast(pl.Float64).clip(lower_bound=1e-12)).log10()


def _plan_features() -> list[pl.Expr]:
    T = c("p_micro_batch") * c("w_seqs_per_sample") * c("w_seq_len") / c("p_cp")
    t = c("p_tp").cast(pl.Float64)
    h = c("m_hidden").cast(pl.Float64)
    f = pl.when(c("m_experts") > 0).then(c("m_expert_ffn")).otherwise(c("m_ffn")).cast(pl.Float64)
    # FLOPs per byte of the MLP up-projection a rank runs (m=T, k=h, n=f/t): m k n / (m k + k n + m n).
    n = f / t
    intensity = T * h * n / (T * h + h * n + T * n)
    return [
        _log(T).alias("f_log_tokens_mb"), _log(intensity).alias("f_log_intensity"),
        _log(c("m_head_dim")).alias("f_log_head_dim"), (c("m_experts") > 0).cast(pl.Float64).alias("f_moe"),
        c("w_seqs_per_sample").cast(pl.Float64).alias("f_seqs_per_sample"),
        (c("w_precision") == "fp32").cast(pl.Float64).alias("f_fp32"),
        _log(c("p_tp")).alias("f_log_tp"), _log(c("p_pp")).alias("f_log_pp"), _log(c("p_dp")).alias("f_log_dp"),
        _log(c("p_cp")).alias("f_log_cp"), c("p_zero").cast(pl.Float64).alias("f_zero"),
        c("p_offload").cast(pl.Float64).alias("f_offload"),
        c("p_schedule").replace_strict(SCHEDULE_CODES, default=0.0, return_dtype=pl.Float64).alias("f_schedule"),
        _log(c("p_vstages")).alias("f_log_vstages"),
        *[(c("p_framework") == fw).cast(pl.Float64).alias(f"f_fw_{fw}") for fw in FRAMEWORK_CODES],
        on_cpu().cast(pl.Float64).alias("f_is_cpu"),
        c("d_tp_cross_node").cast(pl.Float64).alias("f_tp_cross"),
        c("d_dp_cross_node").cast(pl.Float64).alias("f_dp_cross"),
        c("d_pp_cross_node").cast(pl.Float64).alias("f_pp_cross"),
    ]


def time_features(df: pl.DataFrame) -> pl.DataFrame:
    comm = sum(c(f"kc_{p}_frac") for p in ("tp", "pp", "cp", "ep", "dp", "zero3"))
    return df.select(
        *_plan_features(),
        *[c(f"kc_{p}_frac").fill_nan(0.0).alias(f"f_{p}_share") for p in SHARE_PARTS],
        _log(comm / c("kc_compute_frac") + 1e-4).alias("f_log_comm_compute"),
        _log(c("p_grad_accum")).alias("f_log_ga"),
        c("p_recompute").replace_strict(RECOMPUTE_CODES, default=0.0, return_dtype=pl.Float64).alias("f_recompute"),
        c("w_reference").replace_strict(REFERENCE_CODES, default=0.0, return_dtype=pl.Float64).alias("f_reference"),
    )


def memory_features(df: pl.DataFrame) -> pl.DataFrame:
    m = c("d_mem_gib")
    return df.select(
        *_plan_features(),
        c("p_sp").cast(pl.Float64).alias("f_sp"),
        c("p_recompute").replace_strict(RECOMPUTE_CODES, default=0.0, return_dtype=pl.Float64).alias("f_recompute"),
        c("w_reference").replace_strict(REFERENCE_CODES, default=0.0, return_dtype=pl.Float64).alias("f_reference"),
        _log(c("p_grad_accum")).alias("f_log_ga"),
        (c("d_states_gib") / m).alias("f_states_share"), (c("d_act_gib") / m).alias("f_act_share"),
        (c("d_logits_gib") / m).alias("f_logits_share"), (c("d_ref_gib") / m).alias("f_ref_share"),
        (c("d_gathered_bytes") / (m * 2**30)).alias("f_gathered_share"),
    )


def _absolute(df: pl.DataFrame) -> pl.DataFrame:
    """Absolute sizes and counts: what the first shipped correction read. Kept only to compare against (README)."""
    return df.select(_log(c("m_params")).alias("f_log_params"), _log(c("m_hidden")).alias("f_log_hidden"),
                     c("m_layers").cast(pl.Float64).alias("f_layers"), _log(c("c_gpus")).alias("f_log_gpus"),
                     c("c_nodes").cast(pl.Float64).alias("f_nodes"), _log(c("k_step_s")).alias("f_log_composed"),
                     _log(c("c_intra_bw_gb_per_s")).alias("f_log_intra"),
                     _log(c("c_inter_bw_gb_per_s")).alias("f_log_inter"))


FEATURIZERS = {"time": time_features, "memory": memory_features}
BASELINES = {"time": "k_step_s", "memory": "d_mem_gib"}
# One thread: a correction learns from a few thousand rows, where a second thread saves little, and on a busy
# machine xgboost's two OpenMP threads wait on each other (train's out-of-fold fits: 11 CPU-minutes at load 15,
# against 28 s with one thread).
XGB_PLAN = dict(n_estimators=300, max_depth=4, learning_rate=0.05, subsample=0.85, colsample_bytree=0.8,
                min_child_weight=5.0, reg_lambda=5.0, tree_method="hist", n_jobs=1)


class Correction:
    """xgboost on log10(label / baseline), bounded and shrunk by an applicability-domain weight; predicts
    baseline * 10^(w * clip(f(x))). scikit-learn contract: fit returns self, learned attributes end in `_`.

    domain: "framework" gates on (framework family, hardware, single or multi node) seen in training (time: trainers
    built alike share one family, megatron/nanotron and deepspeed/fsdp); "device" on the device class (memory: a
    correction learned on one class did not carry to the other)."""

    def __init__(self, *, kind: str, seed: int = 0, params: dict | None = None, domain: str = "framework",
                 shrink: bool = True, bound: bool = True, absolute: bool = False):
        self.kind = kind
        self.absolute = absolute
        self.seed = seed
        self.params = params
        self.domain = domain
        self.shrink = shrink
        self.bound = bound

    @property
    def baseline(self) -> str:
        return BASELINES[self.kind]

    def features(self, df: pl.DataFrame) -> pl.DataFrame:
        f = FEATURIZERS[self.kind](df)
        return pl.concat([f, _absolute(df)], how="horizontal") if self.absolute else f

    def feature_names(self, df: pl.DataFrame) -> list[str]:
        return self.features(df.head(1)).columns

    def _X(self, df: pl.DataFrame) -> np.ndarray:
        """The feature matrix (read-only). Applying a bundle asks it of one frame twice (the applicability distance,
        then the prediction of the applicable rows): the last frame's is kept, as domain_keys keeps its keys."""
        kept = self._kept("_last_X", df)
        if kept is not None:
            return kept
        f = self.features(df)
        # NaN and null read as 0. Where every feature is a float (as the featurizers build them) a null is NaN in
        # numpy, so both are zeroed there (a select of fills per feature cost as much as the features); else the
        # frame-wide fills (which pass non-float columns by).
        floats = all(t == pl.Float64 for t in f.dtypes)
        X = (f if floats else f.fill_nan(0.0).fill_null(0.0)).to_numpy().astype(float)
        if floats:
            X[np.isnan(X)] = 0.0
        X.flags.writeable = False
        self._last_X = (weakref.ref(df), df.height, X)
        return X

    def _kept(self, name: str, df: pl.DataFrame):
        """What _X or domain_keys kept under `name` for this very frame (a weak reference to it and its height: a
        frame that is gone can never be mistaken for it), else None."""
        last = self.__dict__.get(name)
        return last[2] if last is not None and last[0]() is df and last[1] == df.height else None

    def _domain_key(self, framework: str, hardware: str, multi_node: bool) -> str:
        if self.domain == "device":
            device = "cpu" if hardware in cpu_names() else "gpu"
            return f"trl:{device}" if FAMILY.get(framework) == "trl" else device
        # Crossing nodes changes the communication regime (NVLink -> the network); a correction learned on one
        # node said the wrong thing about several: the playbook's single-node pp-8 runs are 3-4x slower than
        # composed, its 2-4 node pp-8 runs are not, and carrying the factor over cost 5 points on its scale-out.
        return f"{FAMILY.get(framework, framework)}:{hardware}:{'multi' if multi_node else 'single'}-node"

    def domain_keys(self, df: pl.DataFrame) -> list[str]:
        # Applying a bundle asks one frame's keys several times (weight, distance, intervals, the stall guard): the
        # last frame's are kept, by a weak reference to it, so a frame that is gone can never be mistaken for it.
        kept = self._kept("_last_keys", df)
        if kept is not None:
            return list(kept)
        keys = self._domain_keys_of(df)
        self._last_keys = (weakref.ref(df), df.height, keys)
        return list(keys)

    def _domain_keys_of(self, df: pl.DataFrame) -> list[str]:
        multi = (c("c_nodes") > 1) if "c_nodes" in df.columns else pl.lit(False)
        # A ranking's rows share a handful of keys: each distinct one is built once.
        combo = df.select(pl.struct(f=c("p_framework"), g=c("g_name"), m=multi).alias("k"))["k"]
        distinct = combo.unique(maintain_order=True)
        keys = [self._domain_key(r["f"], r["g"], r["m"]) for r in distinct.to_list()]
        if len(keys) == 1:
            return keys * df.height
        index = combo.to_frame().join(distinct.to_frame().with_row_index("i"), on="k", how="left",
                                      maintain_order="left", nulls_equal=True)["i"].to_list()
        return [keys[i] for i in index]

    def interval_keys(self, df: pl.DataFrame) -> list[str]:
        """The domain key, refined for step-time intervals where the pipeline crosses nodes: there the published
        nanotron runs split into two regimes (17 % of the playbook's 1B runs and 39 % of its 8B runs stall by
        1.1-1.8 s per micro-batch: 27 % / 51 % of the 1B / 8B runs whose pipeline crosses nodes, 3 % / 16 % of the
        others) that no configuration column separates, so those rows get their own, wider spread instead of
        widening everyone's."""
        if self.kind == "memory":
            return self._memory_interval_keys(df)
        keys = self.domain_keys(df)
        if self.kind != "time" or not {"d_pp_cross_node", "p_pp"} <= set(df.columns):
            return keys
        ppx = (df["d_pp_cross_node"].fill_null(False) & (df["p_pp"] > 1)).to_list()
        return [f"{k}{PPX_SUFFIX}" if x else k for k, x in zip(keys, ppx, strict=True)]

    def _memory_interval_keys(self, df: pl.DataFrame) -> list[str]:
        """"family:device" per row ("zero:gpu", "3d:gpu", "trl:cpu"): a memory interval's spread is its framework
        family's on its device class, not the device class's pooled over families. Pooled, the GPU spread was the
        playbook's (nanotron logs max_memory_reserved, 0.44-3.6x the analytic peak), and a DeepSpeed or FSDP plan,
        whose measured peaks (ms-swift, Liger's FSDP examples) are 0.96-1.8x of it, got a x2.17 upper end."""
        dev = (pl.when(on_cpu()).then(pl.lit("cpu")).otherwise(pl.lit("gpu")) if "g_name" in df.columns
               else pl.lit("gpu"))
        fam = c("p_framework").replace_strict(FAMILY, default=c("p_framework"), return_dtype=pl.Utf8)
        return df.select(pl.concat_str([fam, dev], separator=":").alias("k"))["k"].to_list()

    def fit(self, df: pl.DataFrame, y: np.ndarray, weight: np.ndarray | None = None) -> Correction:
        keep = ~df["p_framework"].is_in(UNCORRECTED).to_numpy()
        df, y = df.filter(pl.Series(keep)), np.asarray(y, dtype=float)[keep]
        weight = None if weight is None else np.asarray(weight, dtype=float)[keep]
        self.feature_names_ = self.feature_names(df)
        if df.height < 2:
            return self._fit_nothing()
        X = self._X(df)
        target = np.log10(np.asarray(y, dtype=float) / df[self.baseline].to_numpy())
        mono = TIME_MONOTONE if self.kind == "time" else {}
        constraints = "(" + ",".join(str(mono.get(n, 0)) for n in self.feature_names_) + ")"
        self.model_ = GBRegressor(seed=self.seed, **{**(self.params or XGB_PLAN), "monotone_constraints": constraints})
        self.model_.fit(X, target, sample_weight=weight)
        keys, counts = np.unique(np.array(self.domain_keys(df), dtype=object), return_counts=True)
        self.domains_ = sorted(str(k) for k, n in zip(keys, counts, strict=True) if n >= MIN_DOMAIN_ROWS)
        self.bounds_ = (float(np.quantile(target, 0.005)), float(np.quantile(target, 0.995)))
        self.center_ = X.mean(axis=0)
        self.scale_ = np.maximum(X.std(axis=0), 1e-3)
        self.domain_features_ = [n for n in self.feature_names_ if n not in PHYSICS_KNOBS[self.kind]]
        self.train_X_ = X
        self.train_keys_ = np.array(self.domain_keys(df), dtype=object)
        self._trees = None
        self.radius_ = {}
        for key, tree in self._trees_of().items():
            n = tree.n
            if n < 2:
                self.radius_[key] = 1.0
                continue
            d, _ = tree.query(tree.data, k=min(K_NEIGHBOURS + 1, n))
            self.radius_[key] = max(float(np.quantile(np.atleast_2d(d)[:, 1:].mean(axis=1), 0.95)), 1e-3)
        return self

    def _fit_nothing(self) -> Correction:
        """No rows this correction may learn from (e.g. only TRL rows): applicable nowhere, the baseline stands."""
        self.model_ = None
        self.domains_ = []
        self.bounds_ = (0.0, 0.0)
        n = len(self.feature_names_)
        self.center_, self.scale_ = np.zeros(n), np.ones(n)
        self.domain_features_ = list(self.feature_names_)
        self.train_X_ = np.zeros((0, n))
        self.train_keys_ = np.array([], dtype=object)
        self._trees, self.radius_ = {}, {}
        return self

    def _trees_of(self) -> dict:
        """One tree per domain: a row's neighbours are training rows of its own framework family, hardware and
        single/multi node (time) or device class (memory). Neighbours from another domain, whose ratios are another trainer's or
        machine's, said nothing about whether this domain's correction carries (global neighbours let vTrain's
        multi-node rows vouch for the playbook's)."""
        if getattr(self, "_trees", None) is None:
            Z = self._domain_Z(self.train_X_)
            self._trees = {k: Neighbours(Z[self.train_keys_ == k]) for k in sorted(set(self.train_keys_.tolist()))}
        return self._trees

    def _domain_Z(self, X: np.ndarray) -> np.ndarray:
        """Standardised features the applicability distance reads: all but the physics knobs (PHYSICS_KNOBS), so a
        plan and its physics twin get the same weight. A bundle saved before domain_features_ reads them all."""
        names = getattr(self, "domain_features_", None) or self.feature_names_
        cols = [self.feature_names_.index(n) for n in names]
        # the kept columns standardised (each element as standardising all of them, then picking: no copy of the
        # others, a ranking's plans x features matrix twice)
        return (X[:, cols] - self.center_[cols]) / self.scale_[cols]

    def distance(self, df: pl.DataFrame, *, beyond: float | None = None) -> np.ndarray:
        """Mean distance to the K nearest training rows of the row's domain, in units of that domain's own 95th
        percentile; inf for a domain never measured, and (with `beyond`) for rows certainly farther than `beyond`
        (no search needed: nothing past it changes the weight)."""
        Z = self._domain_Z(self._X(df))
        keys = np.array(self.domain_keys(df), dtype=object)
        out = np.full(len(Z), np.inf)
        for key, tree in self._trees_of().items():
            idx = keys == key
            if beyond is not None and idx.any():  # slack: "certainly" must survive the division's rounding
                idx[idx] = ~tree.outside(Z if idx.all() else Z[idx], beyond * self.radius_[key] * (1.0 + 1e-9))
            if not idx.any():
                continue
            d, _ = tree.query(Z[idx], k=min(K_NEIGHBOURS, tree.n))
            d = d.reshape(int(idx.sum()), -1)
            out[idx] = d.mean(axis=1) / self.radius_[key]
        return out

    def in_domain(self, df: pl.DataFrame) -> np.ndarray:
        seen = set(self.domains_)
        keys = self.domain_keys(df)
        known = {k: k in seen for k in set(keys)}
        return np.fromiter((known[k] for k in keys), dtype=bool, count=len(keys))

    def weight(self, df: pl.DataFrame) -> np.ndarray:
        """Applicability of the correction per row, in [0, 1]."""
        w = self.in_domain(df).astype(float)
        if self.shrink and df.height:
            w *= np.clip(2.0 - np.nan_to_num(self.distance(df, beyond=2.0), posinf=2.0), 0.0, 1.0)
        return w

    def predict_log_ratio(self, df: pl.DataFrame, where: np.ndarray | None = None) -> np.ndarray:
        """The bounded correction per row; with `where`, only those rows are predicted (0 elsewhere: rows whose
        weight is 0 need none, and most of a large ranking lies outside every measured domain)."""
        if self.model_ is None:
            return np.zeros(df.height)
        if where is not None:
            out = np.zeros(df.height)
            if where.any():
                X = self._kept("_last_X", df)
                if X is not None:  # the rows' features are known
                    out[where] = self._bounded(self.model_.predict(X[where]))
                else:
                    out[where] = self.predict_log_ratio(df.filter(pl.Series(where)))
            return out
        return self._bounded(self.model_.predict(self._X(df)))

    def _bounded(self, r: np.ndarray) -> np.ndarray:
        if self.bound:
            r = np.clip(r, *self.bounds_)
        return r

    def predict(self, df: pl.DataFrame) -> np.ndarray:
        if not df.height:
            return np.zeros(0)
        return df[self.baseline].to_numpy() * 10.0 ** (self.weight(df) * self.predict_log_ratio(df))


def conformal_quantiles(log_residuals: np.ndarray, coverage: float = 0.9) -> tuple[float, float]:
    """Two-sided split-conformal bounds on log10(measured / predicted)."""
    r = np.asarray(log_residuals, dtype=float)
    r = r[np.isfinite(r)]
    if r.size < 10:
        return (-0.3, 0.3)
    alpha = (1.0 - coverage) / 2.0
    n = r.size
    lo = np.quantile(r, max(0.0, np.floor(alpha * (n + 1)) / n))
    hi = np.quantile(r, min(1.0, np.ceil((1 - alpha) * (n + 1)) / n))
    return float(lo), float(hi)


PPX_SUFFIX = "|pp-cross-node"
APPLICABLE = 0.5  # out-of-fold weight from which a residual says how good the correction is where it applies
MIN_INTERVAL_ROWS = 20  # fewer residuals than this in a key: its bounds come from the next coarser level
MIN_TRANSFER_KEYS = 2  # measured keys needed to measure how a borrowed spread transfers (Intervals._fit_transfer)
# Applicability weights from which an inside row's bounds come from the residuals of rows as applicable as it
# (Intervals.inside_bands_): the correction is surer near its training rows. ours-cpu's memory, out of fold: 90 % of
# residuals within 2.25x high/low at weights 0.5-0.8, 1.49-1.55x from 0.8 up (1.68x pooled).
WEIGHT_BANDS = (APPLICABLE, 0.8)


def _base_key(key: str) -> str:
    return key.split("|", 1)[0]


def _key_parts(key: str) -> tuple[str, str | None, str, str | None, str]:
    """(family, hardware, device class, node regime, regime suffix) of an interval key: a time key is
    "family:hardware:single|multi-node[|suffix]", a memory key "family:gpu|cpu" (bundles before it: "[trl:]gpu|cpu",
    family "*")."""
    base, _, suffix = key.partition("|")
    bits = base.split(":")
    if len(bits) == 3:
        fam, hw, nodes = bits
        return fam, hw, "cpu" if hw in cpu_names() else "gpu", nodes, suffix
    return (bits[0] if len(bits) == 2 else "*"), None, bits[-1], None, suffix


# Families whose runs run on another family's runtimes: TRL's trainers wrap accelerate's DDP, DeepSpeed and FSDP
# (features.trl), so where TRL was never measured on a device class its nearest measured kin is the ZeRO family's
# (DeepSpeed/FSDP under the same caching allocator), not nanotron's or Megatron's 3-D engines.
KIN = {"trl": "zero"}


def _legacy(key: str) -> str:
    """The memory key a bundle fitted before keys named the family held a row's spread under: "trl:cpu" for TRL,
    the device class ("gpu") for the others. A new bundle has no such device-only key, so nothing is pooled."""
    fam, _, dev, _, _ = _key_parts(key)
    return key if fam == "trl" else dev


def _nearness(a: tuple, b: tuple) -> tuple[bool, ...]:
    """How far domain b is from a, lexicographically: the same regime (a cross-node pipeline's stalls), then the
    same device class, framework family (else its kin, KIN), hardware and node regime. (False, ...) sorts first."""
    kin = a[0] == b[0] or KIN.get(a[0]) == b[0]
    return (a[4] != b[4], a[2] != b[2], not kin, a[0] != b[0], a[1] != b[1], a[3] != b[3])


def _borrow(key: str, measured: dict[str, tuple[float, float]]) -> tuple[float, float]:
    """The composition's spread that a key without its own takes from `measured` (non-empty): the widest of its
    nearest keys (_nearness), bracketing the point. Borrowed bounds contain the point: another key's bias says how
    far off a composition can be, not which way this key's is. Without it, Liger's FSDP runs held out took nanotron's
    reserved-peak spread (1.06-2.17x the analytic peak) and 3 of their 10 allocated peaks (0.96-1.83x) were
    covered."""
    me = _key_parts(key)
    near = {k: _nearness(me, _key_parts(k)) for k in measured}
    best = min(near.values())
    ties = [measured[k] for k, d in near.items() if d == best]
    return min(min(t[0] for t in ties), 0.0), max(max(t[1] for t in ties), 0.0)


def _key_weighted_quantile(scores: list[np.ndarray], q: float) -> float:
    """The q-quantile of the pooled scores with every key weighing the same (a key's rows share 1/len(scores)):
    the calibration is over domains, and one source's thousand runs would otherwise speak for every domain."""
    s = np.concatenate(scores)
    w = np.concatenate([np.full(x.size, 1.0 / (x.size * len(scores))) for x in scores])
    order = np.argsort(s, kind="stable")
    cum = np.cumsum(w[order])
    return float(s[order][min(np.searchsorted(cum, q - 1e-12), s.size - 1)])


class Intervals:
    """Split-conformal bounds on log10(measured / predicted), blended by the applicability weight between

    - inside: out-of-fold residuals of the corrected prediction where the correction was applicable in its fold
      (out-of-fold weight >= APPLICABLE), per interval key (Correction.interval_keys) and weight band
      (WEIGHT_BANDS, where the band holds enough residuals), else per key, else per domain;
    - outside: the composition's own residuals in the row's key where that key was measured, else on the nearest
      measured keys (_nearness: same regime, device class, family, hardware, node regime; the widest of the
      nearest ties), widened by the transfer margin measured leave-one-key-out (_fit_transfer). Never a spread
      pooled over every source: pooled, the playbook's stall regime (10-50x per micro-batch) set the width of every
      plan, 25-29x high/low on GPU plans the project holds no run of.

    A key with too few applicable out-of-fold rows has no evidence of how good the correction is there: it takes
    the composition's spread of its key. Outside bounds are at least as wide as inside ones. A hardware no kernel
    model saw a probe of is widened by the composition's residuals on held-out hardware of its device class.

    Every fitted table is a declared attribute (empty until fit/from_dict): readers such as models.stall's
    stall-free guard access them directly, so a rename fails loudly instead of silently turning the guard off."""

    inside_: dict[str, tuple[float, float]]
    domain_: dict[str, tuple[float, float]]
    outside_keys_: dict[str, tuple[float, float]]
    outside_domain_: dict[str, tuple[float, float]]
    unseen_: dict[str, tuple[float, float]]
    transfer_: dict[str, float]
    inside_bands_: dict[str, list[tuple[float, float, float]]]

    def __init__(self) -> None:
        self.inside_, self.domain_, self.outside_keys_, self.outside_domain_, self.unseen_ = {}, {}, {}, {}, {}
        self.transfer_, self.inside_bands_ = {}, {}

    def fit(self, keys: list[str], oof_log_residuals: np.ndarray, baseline_log_residuals: np.ndarray,
            *, oof_weight: np.ndarray | None = None, coverage: float = 0.9) -> Intervals:
        keys_a = np.array(keys, dtype=object)
        base_a = np.array([_base_key(k) for k in keys], dtype=object)
        oof = np.asarray(oof_log_residuals, dtype=float)
        comp = np.asarray(baseline_log_residuals, dtype=float)
        applicable = (np.ones(len(oof), dtype=bool) if oof_weight is None
                      else np.nan_to_num(np.asarray(oof_weight, dtype=float)) >= APPLICABLE)

        def per(groups: np.ndarray, r: np.ndarray, mask: np.ndarray) -> dict[str, tuple[float, float]]:
            out = {}
            for g in sorted(set(groups[mask].tolist())):
                sel = mask & (groups == g) & np.isfinite(r)
                if sel.sum() >= MIN_INTERVAL_ROWS:
                    out[g] = conformal_quantiles(r[sel], coverage)
            return out

        everywhere = np.ones(len(oof), dtype=bool)
        self.inside_ = per(keys_a, oof, applicable)
        self.domain_ = per(base_a, oof, applicable)
        # Per key and weight band (WEIGHT_BANDS): [(lowest weight, lo, hi)] of the bands with enough residuals.
        w_oof = np.nan_to_num(np.asarray(oof_weight, dtype=float), nan=1.0) if oof_weight is not None else None
        self.inside_bands_ = {}
        if w_oof is not None:
            edges = (*WEIGHT_BANDS, np.inf)
            for i, lo_w in enumerate(WEIGHT_BANDS):
                band = per(keys_a, oof, applicable & (w_oof >= lo_w) & (w_oof < edges[i + 1]))
                for k, b in band.items():
                    if k in self.inside_:
                        self.inside_bands_.setdefault(k, []).append((float(lo_w), *b))
        self.outside_keys_ = per(keys_a, comp, everywhere)
        self.outside_domain_ = per(base_a, comp, everywhere)
        self.unseen_ = {}
        self.transfer_ = self._fit_transfer(keys_a, comp, coverage)
        return self

    def _fit_transfer(self, keys: np.ndarray, comp: np.ndarray, coverage: float) -> dict[str, float]:
        """How far a borrowed spread falls short, measured the way it is used: each measured key in turn is treated
        as unmeasured, lent the spread of its nearest other keys (_borrow), and its composition residuals are scored
        by how far they fall below the lent low end and above the lent high end (0 inside). Each side's margin is
        the (1 + coverage) / 2 quantile of its scores, every key weighing the same (a quantile over domains), so a
        borrowed interval covers `coverage` of a new domain's runs as often as it did for the measured ones.

        Without it the nearest keys' spread was lent as is, and a domain whose composition is biased otherwise was
        missed: held out by model, the playbook's nanotron peaks took the ZeRO family's GPU spread (1.54x wide, 71 %
        covered); held out by hardware, ours-cpu's DeepSpeed/FSDP peaks took TRL's CPU spread (1.11x, 18 %). Fewer
        than MIN_TRANSFER_KEYS measured keys: no evidence of how spreads transfer, no margin."""
        if len(self.outside_keys_) < MIN_TRANSFER_KEYS:
            return {}
        lo_s, hi_s = [], []
        for k in self.outside_keys_:
            lo, hi = _borrow(k, {o: v for o, v in self.outside_keys_.items() if o != k})
            r = comp[(keys == k) & np.isfinite(comp)]
            lo_s.append(np.maximum(lo - r, 0.0))
            hi_s.append(np.maximum(r - hi, 0.0))
        q = (1.0 + coverage) / 2.0
        return {"lo": _key_weighted_quantile(lo_s, q), "hi": _key_weighted_quantile(hi_s, q)}

    def fit_unseen_hardware(self, log_residuals: np.ndarray, *, hardware: list[str] | None = None,
                            coverage: float = 0.9) -> Intervals:
        """Bounds for a hardware the kernel models never saw a probe of, per device class, from the composition's
        residuals on each measured hardware of that class with its own probes left out: the kernels' extrapolation
        bias dominates there (CPU without its probes: 56 % off, A100 without its: 101 %)."""
        r = np.asarray(log_residuals, dtype=float)
        dev = np.array(["*"] * r.size if hardware is None else
                       ["cpu" if h in cpu_names() else "gpu" for h in hardware], dtype=object)
        self.unseen_ = {}
        for d in sorted(set(dev.tolist())):
            sel = (dev == d) & np.isfinite(r)
            if sel.sum() >= 10:
                self.unseen_[d] = conformal_quantiles(r[sel], coverage)
        return self

    def nearest(self, key: str) -> tuple[float, float]:
        """The composition's spread on the key itself where measured, else on its nearest measured keys, widened by
        the transfer margin (`transfer_`: how far the composition's residuals on a measured key fell outside what its
        nearest other keys lent it)."""
        if key in self.outside_keys_:
            return self.outside_keys_[key]
        if not self.outside_keys_:
            return conformal_quantiles(np.zeros(0))  # nothing measured at all: the stated default
        lo, hi = _borrow(key, self.outside_keys_)
        d_lo, d_hi = self.transfer_.get("lo", 0.0), self.transfer_.get("hi", 0.0)
        return lo - d_lo, hi + d_hi

    def _pair(self, key: str) -> tuple[tuple[float, float], tuple[float, float]]:
        out = self.nearest(key)
        inside = self.inside_.get(key) or self.domain_.get(_base_key(key)) or self.domain_.get(_legacy(key)) or out
        # Outside bounds bracket the point (lo <= 0 <= hi): there the point is the composition, and a bias the
        # composition showed on the key's other rows (other models, scales) is not known to carry to this one. The
        # playbook's 8B is composed 1.06-1.63x under its measured peaks; once nanotron's stage split and loss logits
        # were charged the 1B is not, and its interval, all above the point, covered 26 % of its runs.
        return inside, (min(out[0], inside[0], 0.0), max(out[1], inside[1], 0.0))

    def _unseen(self, key: str) -> tuple[float, float] | None:
        dev = _key_parts(key)[2]
        return self.unseen_.get(dev) or self.unseen_.get("*") or next(iter(self.unseen_.values()), None)

    def bounds(self, keys: list[str], weight: np.ndarray, unseen: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        # Each distinct key's bounds once, spread over its rows (a ranking's thousands of rows hold a handful).
        distinct = list(dict.fromkeys(keys))
        at = {k: i for i, k in enumerate(distinct)}
        of = np.fromiter((at[k] for k in keys), dtype=np.int64, count=len(keys))
        pairs = [self._pair(k) for k in distinct]
        lo_in, hi_in = np.array([p[0][0] for p in pairs])[of], np.array([p[0][1] for p in pairs])[of]
        wt = np.nan_to_num(np.asarray(weight, dtype=float))
        for i, k in enumerate(distinct):
            # A row inside takes the residuals of its own weight band where that band was measured on enough rows.
            for w_from, b_lo, b_hi in self.inside_bands_.get(k, ()):
                sel = (of == i) & (wt >= w_from)
                lo_in[sel], hi_in[sel] = b_lo, b_hi
        lo_out, hi_out = np.array([p[1][0] for p in pairs])[of], np.array([p[1][1] for p in pairs])[of]
        # The inside bounds were calibrated on out-of-fold rows whose own weight was >= APPLICABLE: a row from that
        # weight up is one of the rows they describe and takes them whole (blended by its weight, a row at 0.8 took a
        # fifth of the outside spread a second time: ours-cpu's step time 2.47x high/low against its key's 2.16x);
        # below, it moves to the outside bounds, reached at weight 0.
        w = np.clip(np.asarray(weight, dtype=float) / APPLICABLE, 0.0, 1.0)
        lo = w * lo_in + (1.0 - w) * lo_out
        hi = w * hi_in + (1.0 - w) * hi_out
        if unseen is not None and unseen.any() and self.unseen_:
            u = [self._unseen(k) for k in distinct]
            ulo = np.array([x[0] if x else 0.0 for x in u])[of]
            uhi = np.array([x[1] if x else 0.0 for x in u])[of]
            lo = np.where(unseen, np.minimum(lo, ulo), lo)
            hi = np.where(unseen, np.maximum(hi, uhi), hi)
        return lo, hi

    def to_dict(self) -> dict:
        def pairs(d: dict) -> dict:
            return {k: list(v) for k, v in d.items()}

        return {"inside": pairs(self.inside_), "domain": pairs(self.domain_),
                "outside_keys": pairs(self.outside_keys_), "outside_domain": pairs(self.outside_domain_),
                "unseen_hardware": pairs(self.unseen_), "transfer": dict(self.transfer_),
                "inside_bands": {k: [list(b) for b in v] for k, v in self.inside_bands_.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> Intervals:
        def pairs(x: dict | None) -> dict:
            return {k: tuple(v) for k, v in (x or {}).items()}

        i = cls()
        i.inside_ = pairs(d["inside"])
        i.domain_ = pairs(d.get("domain"))
        i.outside_keys_ = pairs(d.get("outside_keys"))
        i.outside_domain_ = pairs(d.get("outside_domain"))
        unseen = d.get("unseen_hardware")
        # Bundles before per-class unseen bounds stored one pooled pair.
        i.unseen_ = {"*": tuple(unseen)} if isinstance(unseen, list) else pairs(unseen)
        # Bundles before the transfer margin lent the nearest keys' spread as is.
        i.transfer_ = {k: float(v) for k, v in (d.get("transfer") or {}).items()}
        # ... and before weight bands took every inside row's bounds from its key's residuals whole.
        i.inside_bands_ = {k: [tuple(float(x) for x in b) for b in v] for k, v in (d.get("inside_bands") or {}).items()}
        return i


CORRECTION_OPTIONS = ("kind", "seed", "domain", "shrink", "bound", "absolute")


def _run_lengths(keys: list[str]) -> list[list]:
    """[[key, count], ...] in row order: the training rows' domains, compact in metadata.json."""
    out: list[list] = []
    for k in keys:
        if out and out[-1][0] == k:
            out[-1][1] += 1
        else:
            out.append([k, 1])
    return out


def correction_meta(r: Correction) -> dict:
    """Everything but the booster and the training matrix (saved beside it), JSON-ready."""
    return {**{k: getattr(r, k) for k in CORRECTION_OPTIONS}, "features": r.feature_names_, "domains": r.domains_,
            "bounds_log10": list(r.bounds_), "center": r.center_.tolist(), "scale": r.scale_.tolist(),
            "radius": r.radius_, "train_keys": _run_lengths(r.train_keys_.tolist()),
            "domain_features": r.domain_features_}


def correction_from_meta(meta: dict, model: GBRegressor, train_X: np.ndarray) -> Correction:
    r = Correction(**{k: meta[k] for k in CORRECTION_OPTIONS})
    r.model_ = model
    r.feature_names_ = list(meta["features"])
    r.domains_ = list(meta["domains"])
    r.bounds_ = tuple(meta["bounds_log10"])
    r.center_ = np.asarray(meta["center"], dtype=float)
    r.scale_ = np.asarray(meta["scale"], dtype=float)
    r.radius_ = {k: float(v) for k, v in meta["radius"].items()}
    # absent in bundles saved before the distance left the physics knobs out: theirs read every feature
    r.domain_features_ = list(meta.get("domain_features", meta["features"]))
    r.train_X_ = np.asarray(train_X, dtype=float)
    r.train_keys_ = np.array([k for k, n in meta["train_keys"] for _ in range(n)], dtype=object)
    r._trees = None
    return r
