"""Pipeline stalls as a regime, not an average: a classifier of P(stall) over plan features, the size of a stall,
and the mixture of the two regimes that a prediction, its interval and a ranking read.

Why (datasets/public/ultrascale_playbook, the only source with multi-node pipelines): the published nanotron runs
are bimodal. Over the stall-free reference (the composition times the median measured/composed ratio of the
family's stall-free runs), the excess per micro-batch of the 982 multi-node runs has one mode at 0-0.3 s (the
composition's own error) and another at 1.0-1.8 s (the stall), with a valley between: over cross-node pipelines,
9-20 runs per 0.1 s bin at 0.4-1.0 s against 58-92 at 0-0.3 s and 72 per bin at 1.2-1.6 s. STALL_S_PER_MICROBATCH
= 0.5 s sits in that valley; it is also about twice the largest composed micro-batch of the 8B (0.26 s at pp 2), so
a composition error under 2x is not called a stall. Of the 45 single-node runs one exceeds it: a single node is
out of scope (P = 0), like every family without enough multi-node runs to learn from (MIN_ROWS, MIN_STALLED).

What is modelled:
- P(stall): logistic regression (StallClassifier, scikit-learn contract, saved as its coefficients in JSON with
  checked metadata; no pickle) over plan features that transfer across model sizes (FEATURES), Platt-calibrated
  on its out-of-fold decision values with one node count held out at a time (StallModel._calibration: the slope;
  the intercept keeps the training runs' stall rate).
- The stall's size: seconds per micro-batch, log-linear in the node count, with the 90 % split-conformal spread of
  its log.
- The mixture: stalled time = stall-free time + micro-batches x stall size. The point prediction is the regime
  that minimises the expected relative error (point_time: the stall-free step unless a stall is likely), the
  interval the mixture's 5th and 95th percentiles (mixture_bounds) instead of one spread covering both modes, the
  expected time is stall-free x (1 - p) + stalled x p, and `rank` orders by the expected throughput over the two
  regimes (expected_steps_per_s: the mean of their throughputs, not the throughput of the expected time).

Held out (the playbook's 8B, trained on its 1B) P(stall) stays under-calibrated: mean 0.27 against a 45 % stall
rate, AUC 0.83 (0.28 before the intercept kept the training rate; on the 1B held out by node count that change
took the mean from 0.228 to 0.210 against 0.189). At every node count the 8B stalls more often than the 1B (4 nodes:
27 % against 3 %), and no feature of the 1B runs carries that shift (the work per GPU and the message sizes lower the 1B's rate as they grow),
so the point stays stall-free unless a stall is very likely, where a low P(stall) costs the least."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl

from perfpredict.core.errors import PerfPredictError
from perfpredict.core.frameworks import FAMILY

c = pl.col
STALL_SCHEMA_VERSION = 2  # 2: transferable features, Platt calibration
STALL_FILE = "stall.json"
STALL_S_PER_MICROBATCH = 0.5  # the bimodal valley of the excess per micro-batch (module docstring)
MIN_ROWS, MIN_STALLED = 30, 10  # multi-node runs (and stalled ones among them) a family needs to be in scope
L2 = 1.0  # ridge on the standardised coefficients: ~600 runs per fit, two models, correlated features
Z95 = 1.6448536269514722

# Features that transfer across model sizes (a user extrapolates to a larger model than the runs measured): the
# cluster's nodes, the work per GPU, the share of the pipeline's stage boundaries that cross nodes and the nodes a
# tensor-parallel group spans. Chosen on the training side, out of fold with one node count held out at a time
# (playbook 1B, AUC): these four 0.874; with the tp degree itself instead of its node span 0.866; with the pipeline's
# node span and depth, micro-batches, dp, micro-batch size, tp across nodes, cross-node sends per step and one
# send's time on the link 0.862; with the parameters 0.859. tp inside a node talks over NVLink: the 1B's runs
# without a pipeline stall at 0-5 % for tp 1-8 (no trend), 16 % at tp 32 (4 nodes); with the degree itself, P(stall)
# rose with tp inside a node, and the expected step ranked a 32-node tp2 plan (measured 0.29 s) above its tp4 twin
# (0.17 s, the group's best) out of fold. The model's size itself is not one: trained on one size it has no spread
# to learn from, and a coefficient for it would not transfer.
FEATURES = ("x_log2_nodes", "x_log2_tokens_per_gpu", "x_pp_cross_share", "x_log2_tp_nodes")


def _feature_exprs() -> dict[str, pl.Expr]:
    """The stall features as polars expressions.

    A pipeline's nodes with Megatron's/nanotron's rank order (tp fastest, then cp, dp, pp): a stage occupies
    tp x cp x dp consecutive ranks, so a chain of stages spans ceil(pp x inner / gpus per node) nodes when a stage
    fits in a node (features.compute.placement calls it not cross-node, yet pp 8 x dp 4 crosses 3 node boundaries)
    and pp nodes when it does not; never more than the cluster has."""
    gpn = c("c_gpus_per_node").cast(pl.Float64)
    inner = (c("p_tp") * c("p_cp") * c("p_dp")).cast(pl.Float64)
    pp = c("p_pp").cast(pl.Float64)
    nodes = c("c_nodes").cast(pl.Float64)
    span = pl.min_horizontal(pl.when(inner >= gpn).then(pp).otherwise((pp * inner / gpn).ceil()), nodes)
    span = pl.max_horizontal(span, pl.lit(1.0))
    return {
        "x_log2_nodes": nodes.log(2),
        # tokens a GPU processes per step: the work that hides (or fails to hide) a late send
        "x_log2_tokens_per_gpu": (c("d_tokens_per_step").cast(pl.Float64) / c("c_gpus").cast(pl.Float64)).log(2),
        # the share of the pipeline's stage boundaries that cross between nodes
        "x_pp_cross_share": pl.when(pp > 1).then((span - 1.0) / (pp - 1.0)).otherwise(0.0),
        # nodes a tensor-parallel group spans (0 inside a node: its collectives stay on NVLink)
        "x_log2_tp_nodes": (c("p_tp").cast(pl.Float64) / gpn).clip(lower_bound=1.0).log(2),
    }


def stall_features(df: pl.DataFrame) -> np.ndarray:
    """Scale-free plan features, one row per plan (vectorised polars expressions)."""
    ex = _feature_exprs()
    return df.select(**{f: ex[f] for f in FEATURES}).to_numpy().astype(float)


def _family(df: pl.DataFrame) -> np.ndarray:
    return df["p_framework"].replace_strict(FAMILY, default=df["p_framework"]).to_numpy()


def _multi_node_gpu(df: pl.DataFrame) -> np.ndarray:
    from perfpredict.features.compute import on_cpu  # features layer: only where a frame is scored

    return (df["c_nodes"].to_numpy() > 1) & ~df.select(on_cpu()).to_series().fill_null(False).to_numpy()


class StallClassifier:
    """L2-regularised logistic regression fitted by Newton's method on standardised features; the scikit-learn
    estimator contract (fit / predict_proba / predict / get_params / set_params, fitted attributes ending in _)
    without importing scikit-learn on the prediction path. Saved as its coefficients (to_dict)."""

    def __init__(self, *, l2: float = L2, max_iter: int = 50):
        self.l2 = l2
        self.max_iter = max_iter

    def get_params(self, deep: bool = True) -> dict:
        return {"l2": self.l2, "max_iter": self.max_iter}

    def set_params(self, **params) -> StallClassifier:
        for k, v in params.items():
            setattr(self, k, v)
        return self

    def fit(self, X: np.ndarray, y: np.ndarray, sample_weight: np.ndarray | None = None) -> StallClassifier:
        X, y = np.asarray(X, dtype=float), np.asarray(y, dtype=float)
        w = np.ones(len(y)) if sample_weight is None else np.asarray(sample_weight, dtype=float)
        self.center_ = X.mean(axis=0)
        self.scale_ = np.where(X.std(axis=0) > 1e-9, X.std(axis=0), 1.0)  # a constant feature keeps coefficient 0
        Z = np.hstack([np.ones((len(X), 1)), (X - self.center_) / self.scale_])
        beta = np.zeros(Z.shape[1])
        ridge = np.full(Z.shape[1], self.l2)
        ridge[0] = 0.0  # the intercept is not shrunk
        for _ in range(self.max_iter):
            p = 1.0 / (1.0 + np.exp(-Z @ beta))
            grad = Z.T @ (w * (p - y)) + ridge * beta
            H = (Z * (w * p * (1 - p))[:, None]).T @ Z + np.diag(ridge + 1e-9)
            step = np.linalg.solve(H, grad)
            beta -= step
            if np.max(np.abs(step)) < 1e-8:
                break
        self.intercept_, self.coef_ = float(beta[0]), beta[1:]
        self.classes_ = np.array([False, True])
        return self

    def decision_function(self, X: np.ndarray) -> np.ndarray:
        return self.intercept_ + ((np.asarray(X, dtype=float) - self.center_) / self.scale_) @ self.coef_

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        p = 1.0 / (1.0 + np.exp(-self.decision_function(X)))
        return np.column_stack([1.0 - p, p])

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.predict_proba(X)[:, 1] >= 0.5

    def to_dict(self) -> dict:
        return {"l2": self.l2, "intercept": self.intercept_, "coef": self.coef_.tolist(),
                "center": self.center_.tolist(), "scale": self.scale_.tolist()}

    @classmethod
    def from_dict(cls, d: dict) -> StallClassifier:
        m = cls(l2=float(d["l2"]))
        m.intercept_ = float(d["intercept"])
        m.coef_, m.center_, m.scale_ = (np.asarray(d[k], dtype=float) for k in ("coef", "center", "scale"))
        m.classes_ = np.array([False, True])
        return m


def reference_ratios(df: pl.DataFrame, *, iterations: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """(stall-free reference time, stalled label) per composed time row: the composition times its family's
    median measured/composed ratio over the family's stall-free runs (iterated from all runs: the stalls must not
    raise the reference they are measured against), stalled where a multi-node GPU run exceeds it by more than
    STALL_S_PER_MICROBATCH per micro-batch."""
    k = df["k_step_s"].to_numpy()
    y = df["step_time_s"].to_numpy()
    m = (df["p_grad_accum"] * df["p_vstages"]).to_numpy().astype(float)
    fam = _family(df)
    scope = _multi_node_gpu(df)
    ratio = y / k
    ref = np.empty(len(k))
    stalled = np.zeros(len(k), dtype=bool)
    for f in np.unique(fam):
        sel = fam == f
        for _ in range(iterations):
            r0 = float(np.median(ratio[sel & ~stalled])) if (sel & ~stalled).any() else 1.0
            ref[sel] = k[sel] * r0
            stalled[sel] = scope[sel] & ((y[sel] - ref[sel]) / m[sel] > STALL_S_PER_MICROBATCH)
    return ref, stalled


def _platt(z: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(a, b) of P = 1 / (1 + exp(-(a z + b))) fitted to labels y on decision values z (Platt scaling)."""
    m = StallClassifier(l2=1e-6).fit(z[:, None], y)
    a = float(m.coef_[0] / m.scale_[0])
    return a, float(m.intercept_ - a * m.center_[0])


def _intercept(a: float, z: np.ndarray, y: np.ndarray, *, start: float = 0.0, iterations: int = 100) -> float:
    """b with sum(sigmoid(a z + b)) = sum(y): the logistic likelihood's intercept for a fixed slope (Newton, 1-D;
    the likelihood is concave in b, so it converges from any start)."""
    b, y = float(start), np.asarray(y, dtype=float)
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(a * z + b)))
        step = float(np.sum(p - y) / max(np.sum(p * (1.0 - p)), 1e-12))
        b -= float(np.clip(step, -5.0, 5.0))
        if abs(step) < 1e-10:
            break
    return b


def point_time(free: np.ndarray, stalled: np.ndarray, p: np.ndarray) -> np.ndarray:
    """The point prediction of a two-regime step: the stall-free step unless a stall is likely enough.

    Over the mixture, the point x minimising the expected |x / y - 1| is the 1/y-weighted median of the two regimes:
    the stalled step where p / stalled > (1 - p) / free, i.e. p > stalled / (free + stalled) (above one half, more
    the longer the stall), the stall-free step otherwise. The expectation (what `rank` orders by) is the wrong point
    for a bimodal step: it sits between the modes, where no run lands, and held out it doubled the playbook's error
    on deep cross-node pipelines (CHANGELOG)."""
    return np.where(p * free > (1.0 - p) * stalled, stalled, free)


def expected_steps_per_s(free: np.ndarray, stalled: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Steps per second expected over the two regimes: (1 - p) / stall-free + p / stalled, what `rank` orders by.

    A published run is in one regime for its whole length (the playbook's runs are bimodal per run), so the
    throughput a user gets is one regime's, and the plan with the most expected throughput is the one whose
    expected regret (the share of the best throughput lost, evaluate._ranking) is least. 1 / (expected time)
    is not that: a stall is charged per micro-batch (nanotron sends each micro-batch's activations and gradients
    with blocking metadata send/recv, parallel/pipeline_parallel/p2p.py:207-275 and state.py:15-50, on every
    micro-batch of the 1F1B loop, engine.py:292-313; huggingface/nanotron@2411b02), so the stalled step grows with
    the micro-batch count without bound while the throughput it takes away is at most the stall-free one times p. Held out by node count on the
    playbook's 1B (the only multi-node runs outside the test partition), among the pipeline plans of each group:
    top-1 regret 14.1 -> 9.5 % (pp >= 2), 48.6 -> 26.2 % (pp >= 4), 22.9 -> 19.6 % (pp >= 8); over all plans
    17.9 % either way (CHANGELOG)."""
    return (1.0 - p) / free + p / stalled


class StallModel:
    """P(stall), the stall's size and the mixture for the families in scope (module docstring)."""

    def __init__(self, *, seed: int = 0):
        self.seed = seed  # deterministic fit; kept for the trainer's uniform signature

    def fit(self, df: pl.DataFrame) -> StallModel:
        """`df`: composed time rows (k_step_s and step_time_s)."""
        ref, stalled = reference_ratios(df)
        fam = _family(df)
        scope = _multi_node_gpu(df)
        self.families_ = sorted(f for f in np.unique(fam[scope]).tolist()
                                if (scope & (fam == f)).sum() >= MIN_ROWS and (stalled & (fam == f)).sum() >= MIN_STALLED)
        sel = scope & np.isin(fam, self.families_)
        self.rows_, self.stalled_ = int(sel.sum()), int((sel & stalled).sum())
        self.calibration_ = {"a": 1.0, "b": 0.0, "rows": 0}
        if not self.families_:
            self.classifier_ = None
            self.size_ = {"a": 0.0, "b": 0.0, "lo": 0.0, "hi": 0.0}
            return self
        X = stall_features(df.filter(pl.Series(sel)))
        y = stalled[sel]
        self.classifier_ = StallClassifier().fit(X, y)
        self.calibration_ = self._calibration(X, y, df["c_nodes"].to_numpy()[sel],
                                              self.classifier_.decision_function(X))
        st = sel & stalled
        m = (df["p_grad_accum"] * df["p_vstages"]).to_numpy().astype(float)
        size = np.log10((df["step_time_s"].to_numpy()[st] - ref[st]) / m[st])  # > threshold > 0 by the label
        x = np.log2(df["c_nodes"].to_numpy().astype(float))[st]
        A = np.column_stack([np.ones_like(x), x])
        a, b = np.linalg.lstsq(A, size, rcond=None)[0] if np.ptp(x) > 0 else (float(np.median(size)), 0.0)
        b = max(float(b), 0.0)  # more nodes never shrink a stall (the measured spread only grows with them)
        a = float(np.median(size - b * x))
        from perfpredict.models.plan_model import conformal_quantiles

        lo, hi = conformal_quantiles(size - (a + b * x))
        self.size_ = {"a": a, "b": b, "lo": lo, "hi": hi}
        return self

    @staticmethod
    def _calibration(X: np.ndarray, y: np.ndarray, nodes: np.ndarray, z_fit: np.ndarray | None = None) -> dict:
        """Platt scaling of the classifier's decision values out of fold, one node count held out at a time (a user
        asks about more nodes than were measured): the in-sample fit is over-confident where it extrapolates. Held
        out by node count on the playbook's 1B runs the slope is ~0.8 (shrinks the logit); with fewer than two
        node counts, or a fold without both outcomes in training, the identity.

        The slope comes from the out-of-fold values, the intercept from the fitted classifier's own values
        `z_fit` (the MLE with the slope fixed: the mean P over the training runs equals their stall rate). Platt's
        intercept fitted out of fold belongs to the out-of-fold values' spread, not to the fitted ones it is
        applied to: with the slope below one it moved every P the same way (the playbook 1B's P held out by node
        count averaged 0.226 against a 0.209 stall rate; a synthetic set's 0.13-0.17 against 0.18-0.22); with
        this intercept 0.208 against 0.209, Brier 0.110 -> 0.106, log-loss 0.340 -> 0.332 (CHANGELOG)."""
        z = np.full(len(y), np.nan)
        for g in np.unique(nodes):
            held = nodes == g
            if y[~held].sum() < MIN_STALLED or (~y[~held]).sum() < MIN_STALLED:
                continue
            z[held] = StallClassifier().fit(X[~held], y[~held]).decision_function(X[held])
        ok = np.isfinite(z)
        if ok.sum() < MIN_ROWS or y[ok].all() or not y[ok].any():
            return {"a": 1.0, "b": 0.0, "rows": 0}
        a, b = _platt(z[ok], y[ok])
        if z_fit is not None:
            b = _intercept(a, z_fit, y, start=b)
        return {"a": a, "b": b, "rows": int(ok.sum())}

    def in_scope(self, df: pl.DataFrame) -> np.ndarray:
        if self.classifier_ is None or not df.height:
            return np.zeros(df.height, dtype=bool)
        return _multi_node_gpu(df) & np.isin(_family(df), self.families_)

    def proba(self, df: pl.DataFrame, scope: np.ndarray | None = None) -> np.ndarray:
        """Calibrated P(stall) per plan; 0 out of scope (a single node, a family without measured multi-node
        stalls). `scope`: in_scope(df) where the caller has it already."""
        scope = self.in_scope(df) if scope is None else scope
        p = np.zeros(df.height)
        if scope.any():
            # the features of every row, then the rows in scope (row-wise expressions: the same numbers as
            # featurising the rows in scope alone, without copying a ranking's few hundred columns to filter them)
            z = self.classifier_.decision_function(stall_features(df)[scope])
            p[scope] = 1.0 / (1.0 + np.exp(-(self.calibration_["a"] * z + self.calibration_["b"])))
        return p

    def stall_s(self, df: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A stall's seconds per step (micro-batches x size per micro-batch) with its 90 % bounds.

        Per micro-batch, not per step or per pipeline flush: every micro-batch crosses each stage boundary twice
        with blocking sends (expected_steps_per_s), and on the playbook's stalled 1B runs (held out by model, the
        composition of a bundle that never saw them) the excess over the stall-free reference grows as
        micro-batches^1.09: its log's spread around a fit in the node count is 0.145 per micro-batch, 0.183 per
        micro-batch plus the pp - 1 of fill and drain, 0.58 per step."""
        m = (df["p_grad_accum"] * df["p_vstages"]).to_numpy().astype(float)
        s = m * 10.0 ** (self.size_["a"] + self.size_["b"] * np.log2(df["c_nodes"].to_numpy().astype(float)))
        return s, s * 10.0 ** self.size_["lo"], s * 10.0 ** self.size_["hi"]

    def to_dict(self) -> dict:
        return {"stall_schema_version": STALL_SCHEMA_VERSION, "features": list(FEATURES),
                "threshold_s_per_microbatch": STALL_S_PER_MICROBATCH, "families": self.families_,
                "rows": self.rows_, "stalled": self.stalled_, "stall_size_log10_s_per_microbatch": self.size_,
                "calibration": self.calibration_,
                "classifier": None if self.classifier_ is None else self.classifier_.to_dict()}

    @classmethod
    def from_dict(cls, d: dict, where: str = "stall model") -> StallModel:
        if d.get("stall_schema_version") != STALL_SCHEMA_VERSION:
            raise PerfPredictError(f"{where} has stall schema {d.get('stall_schema_version')}, this perfpredict reads "
                                   f"{STALL_SCHEMA_VERSION}; retrain with `perfpredict train`")
        if d.get("features") != list(FEATURES):
            raise PerfPredictError(f"{where} was fitted on other features than this code builds; retrain with "
                                   "`perfpredict train`")
        clf = d.get("classifier")
        if clf is not None and len(clf.get("coef", [])) != len(FEATURES):
            raise PerfPredictError(f"{where}: {len(clf.get('coef', []))} coefficients for {len(FEATURES)} features")
        m = cls()
        m.families_, m.rows_, m.stalled_ = list(d["families"]), int(d["rows"]), int(d["stalled"])
        m.size_ = {k: float(d["stall_size_log10_s_per_microbatch"][k]) for k in ("a", "b", "lo", "hi")}
        cal = d["calibration"]
        m.calibration_ = {"a": float(cal["a"]), "b": float(cal["b"]), "rows": int(cal["rows"])}
        m.classifier_ = None if clf is None else StallClassifier.from_dict(clf)
        return m

    def save(self, path: Path | str) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1, sort_keys=True))

    @classmethod
    def load(cls, path: Path | str) -> StallModel:
        return cls.from_dict(json.loads(Path(path).read_text()), where=f"stall model {str(path)!r}")


def stall_free(t: np.ndarray, k: np.ndarray, keys: list[str], outside_keys: dict[str, tuple[float, float]]
               ) -> np.ndarray:
    """The guard: a prediction for a cross-node pipeline (interval key `...|pp-cross-node`) is stall-free up to the
    ratio over the composition that its domain's runs reach (the upper 90 % conformal bound of the composition's
    residuals on the base key, plan_model.Intervals.outside_keys_); the rest is stall. A correction trained on
    stall-free runs rarely reaches the cap; one trained before the stall model (averaging both regimes) does."""
    cap = np.full(len(t), np.inf)
    cached: dict[str, float] = {}
    for key in set(keys):
        base, _, regime = key.partition("|")
        cached[key] = 10.0 ** max(outside_keys[base][1], 0.0) if regime and base in outside_keys else np.inf
    cap = np.array([cached[k] for k in keys], dtype=float) if keys else cap
    return np.minimum(t, k * cap)


def _ndtr(z: np.ndarray) -> np.ndarray:
    """The standard normal CDF, vectorised (Abramowitz & Stegun 7.1.26, |error| < 1.5e-7): no scipy import on the
    ranking path."""
    x = np.abs(z) / np.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * x)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = 1.0 - poly * np.exp(-x * x)
    return 0.5 * (1.0 + np.sign(z) * erf)


def _split_normal_cdf(x: np.ndarray, mid: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """CDF in log space of a split normal whose median is `mid` and 5th / 95th percentiles `lo` / `hi`."""
    s = np.where(x < mid, np.maximum(mid - lo, 1e-6), np.maximum(hi - mid, 1e-6)) / Z95
    return _ndtr((x - mid) / s)


def mixture_bounds(free: np.ndarray, free_lo: np.ndarray, free_hi: np.ndarray, stalled: np.ndarray,
                   stalled_lo: np.ndarray, stalled_hi: np.ndarray, p: np.ndarray, *, coverage: float = 0.9,
                   iterations: int = 48) -> tuple[np.ndarray, np.ndarray]:
    """The (1 - coverage) / 2 and (1 + coverage) / 2 quantiles of (1 - p) x F_free + p x F_stalled, each regime a
    split log-normal through its point and 90 % bounds; bisection in log space, all rows at once.

    The numbers of _mixture_bounds_reference (tests/test_stall.py), bit for bit, at a third of its time (a 70B
    ranking bisects 7,000 rows 48 times, once per quantile): only the rows mixing both regimes are bisected (the
    others get their one regime's bounds, below), both quantiles in one pass, and each regime's two log-space
    spreads divided out before the loop (_split_normal_cdf's where and division per iteration: the same values)."""
    p = np.asarray(p, dtype=float)
    lo, hi = np.empty(len(p)), np.empty(len(p))
    one = (p <= 0.0) | (p >= 1.0)  # NaN mixes (as the reference bisects it)
    mix = ~one
    if mix.any():
        m = int(mix.sum())
        f, flo, fhi, s, slo, shi = (np.log10(np.maximum(np.asarray(v, dtype=float)[mix], 1e-12))
                                    for v in (free, free_lo, free_hi, stalled, stalled_lo, stalled_hi))
        pm = p[mix]
        a = (1.0 - coverage) / 2.0
        q = np.repeat([a, 1.0 - a], m).reshape(2, m)  # row 0: the lower quantile, row 1: the upper
        lo_b = np.tile(np.minimum(flo, slo) - 1.0, (2, 1))
        hi_b = np.tile(np.maximum(fhi, shi) + 1.0, (2, 1))
        wf, ws = 1.0 - pm, pm
        # per regime: its median and its spread below / above it, in standard deviations
        regimes = [(mid, np.maximum(mid - lo_, 1e-6) / Z95, np.maximum(hi_ - mid, 1e-6) / Z95)
                   for mid, lo_, hi_ in ((f, flo, fhi), (s, slo, shi))]
        for _ in range(iterations):
            x = 0.5 * (lo_b + hi_b)
            (f_mid, f_below, f_above), (s_mid, s_below, s_above) = regimes
            F = (wf * _ndtr((x - f_mid) / np.where(x < f_mid, f_below, f_above))
                 + ws * _ndtr((x - s_mid) / np.where(x < s_mid, s_below, s_above)))
            below = F < q
            lo_b, hi_b = np.where(below, x, lo_b), np.where(below, hi_b, x)
        bounds = 10.0 ** (0.5 * (lo_b + hi_b))
        lo[mix], hi[mix] = bounds[0], bounds[1]
    # Where the mixture is one regime the bounds are that regime's own (no bisection rounding).
    lo[one] = np.where(p[one] <= 0.0, np.asarray(free_lo, dtype=float)[one], np.asarray(stalled_lo, dtype=float)[one])
    hi[one] = np.where(p[one] <= 0.0, np.asarray(free_hi, dtype=float)[one], np.asarray(stalled_hi, dtype=float)[one])
    return lo, hi


def _mixture_bounds_reference(free: np.ndarray, free_lo: np.ndarray, free_hi: np.ndarray, stalled: np.ndarray,
                              stalled_lo: np.ndarray, stalled_hi: np.ndarray, p: np.ndarray, *,
                              coverage: float = 0.9, iterations: int = 48) -> tuple[np.ndarray, np.ndarray]:
    """mixture_bounds as first written (every row, one quantile at a time): what tests/test_stall.py checks the
    fast one against."""
    logs = [np.log10(np.maximum(v, 1e-12)) for v in (free, free_lo, free_hi, stalled, stalled_lo, stalled_hi)]
    f, flo, fhi, s, slo, shi = logs
    a = (1.0 - coverage) / 2.0
    out = []
    for q in (a, 1.0 - a):
        lo_b, hi_b = np.minimum(flo, slo) - 1.0, np.maximum(fhi, shi) + 1.0
        for _ in range(iterations):
            mid = 0.5 * (lo_b + hi_b)
            F = (1.0 - p) * _split_normal_cdf(mid, f, flo, fhi) + p * _split_normal_cdf(mid, s, slo, shi)
            below = F < q
            lo_b, hi_b = np.where(below, mid, lo_b), np.where(below, hi_b, mid)
        out.append(10.0 ** (0.5 * (lo_b + hi_b)))
    lo, hi = out
    lo = np.where(p <= 0.0, free_lo, np.where(p >= 1.0, stalled_lo, lo))
    hi = np.where(p <= 0.0, free_hi, np.where(p >= 1.0, stalled_hi, hi))
    return lo, hi


def load_stall(path: Path | str) -> StallModel | None:
    """The stall model saved beside a bundle (STALL_FILE), None for a bundle saved without one."""
    p = Path(path) / STALL_FILE
    return StallModel.load(p) if p.exists() else None
