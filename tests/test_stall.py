"""The stall regime model (models.stall): its classifier's contract and round trip, the labels' threshold, the
mixture's bounds, and the stall-free guard reading a declared attribute of Intervals."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from perfpredict.core.errors import PerfPredictError
from perfpredict.models.bundle import default_path
from perfpredict.models.plan_model import Intervals
from perfpredict.models.stall import (
    FEATURES,
    STALL_FILE,
    STALL_S_PER_MICROBATCH,
    StallClassifier,
    StallModel,
    _intercept,
    expected_steps_per_s,
    mixture_bounds,
    point_time,
    reference_ratios,
    stall_features,
    stall_free,
)


def test_classifier_recovers_a_logistic_rule_and_round_trips():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 3))
    y = rng.random(2000) < 1 / (1 + np.exp(-(2.0 * X[:, 0] - 1.0 * X[:, 1])))
    m = StallClassifier(l2=0.1).fit(X, y)
    assert m.coef_[0] == pytest.approx(2.0, abs=0.3) and m.coef_[1] == pytest.approx(-1.0, abs=0.3)
    assert abs(m.coef_[2]) < 0.2
    assert m.get_params() == {"l2": 0.1, "max_iter": 50}
    back = StallClassifier.from_dict(json.loads(json.dumps(m.to_dict())))
    np.testing.assert_allclose(back.predict_proba(X), m.predict_proba(X))
    assert (m.predict(X) == (m.predict_proba(X)[:, 1] >= 0.5)).all()


def _runs(n: int = 400, seed: int = 0) -> pl.DataFrame:
    """Multi-node 3d runs: composed 0.1 s per micro-batch, measured at 0.9x, and stalled ones (+1.2 s per
    micro-batch): half the 16-node runs, a fifth of the 8-node ones."""
    rng = np.random.default_rng(seed)
    nodes = rng.choice([2, 4, 8, 16], n)
    m = rng.choice([4, 8, 16], n)
    k = 0.1 * m
    stalled = rng.random(n) < np.where(nodes == 16, 0.5, np.where(nodes == 8, 0.2, 0.0))
    y = 0.9 * k * rng.lognormal(0, 0.05, n) + stalled * 1.2 * m
    return pl.DataFrame({
        "p_framework": ["nanotron"] * n, "c_nodes": nodes, "c_gpus_per_node": [8] * n, "g_name": ["h100-sxm-80gb"] * n,
        "g_device": ["gpu"] * n, "p_tp": [2] * n, "p_cp": [1] * n, "p_dp": [4] * n, "p_pp": nodes,
        "p_grad_accum": m, "p_vstages": [1] * n, "p_micro_batch": [1] * n, "m_params": [8e9] * n,
        "c_gpus": nodes * 8, "d_tokens_per_step": m * 4 * 4096, "w_seq_len": [4096] * n, "m_hidden": [4096] * n,
        "p_sp": [True] * n, "c_inter_bw_gb_per_s": [50.0] * n,
        "k_step_s": k, "step_time_s": y, "truth": stalled})


def test_tensor_parallelism_inside_a_node_is_not_a_stall_feature():
    """P(stall) reads the nodes a tp group spans, not the degree: tp 1-8 on 8-GPU nodes stay on NVLink (the 1B's
    runs without a pipeline stall at 0-5 % with no trend there), so plans differing only in tp inside a node get the
    same P(stall) and the expected step keeps their stall-free order."""
    df = pl.concat([_runs(8, seed=1).with_columns(p_tp=pl.lit(tp), p_dp=pl.lit(64 // tp)) for tp in (1, 2, 8, 16, 32)])
    tp_nodes = stall_features(df)[:, FEATURES.index("x_log2_tp_nodes")]
    np.testing.assert_array_equal(tp_nodes, np.repeat([0.0, 0.0, 0.0, 1.0, 2.0], 8))
    sm = StallModel().fit(_runs())
    inside = [sm.proba(_runs(8, seed=2).with_columns(p_tp=pl.lit(tp), p_dp=pl.lit(64 // tp))) for tp in (1, 2, 8)]
    np.testing.assert_array_equal(inside[0], inside[1])
    np.testing.assert_array_equal(inside[0], inside[2])


def test_labels_sit_in_the_bimodal_gap_and_the_model_learns_where_stalls_happen():
    df = _runs()
    ref, stalled = reference_ratios(df)
    assert (stalled == df["truth"].to_numpy()).all()
    np.testing.assert_allclose(ref / df["k_step_s"].to_numpy(), 0.9, rtol=0.02)  # the stall-free median, not all
    sm = StallModel().fit(df)
    assert sm.families_ == ["3d"]
    p = sm.proba(df)
    deep = df["c_nodes"].to_numpy() == 16
    assert p[deep].mean() > 0.3 > p[~deep].mean()
    s, lo, hi = sm.stall_s(df)
    np.testing.assert_allclose(s / df["p_grad_accum"].to_numpy(), 1.2, rtol=0.1)
    assert (lo <= s).all() and (s <= hi).all()
    # out of scope: one node, another family
    single = df.with_columns(c_nodes=pl.lit(1), p_pp=pl.lit(1))
    assert (sm.proba(single) == 0).all()
    assert (sm.proba(df.with_columns(p_framework=pl.lit("fsdp"))) == 0).all()
    assert STALL_S_PER_MICROBATCH == 0.5
    # calibrated out of fold by node count: a slope, not the identity, from enough held-out rows
    assert sm.calibration_["rows"] >= 100 and sm.calibration_["a"] > 0


def test_point_is_the_regime_that_minimises_the_expected_relative_error():
    free, stalled = np.full(5, 1.0), np.full(5, 3.0)
    p = np.array([0.0, 0.5, 0.74, 0.76, 1.0])  # the stalled step once p > 3 / (1 + 3)
    np.testing.assert_allclose(point_time(free, stalled, p), [1.0, 1.0, 1.0, 3.0, 3.0])
    # what it minimises, checked by brute force over the mixture
    for q in p:
        loss = {x: (1 - q) * abs(x / 1.0 - 1) + q * abs(x / 3.0 - 1) for x in np.linspace(0.5, 4.0, 351)}
        best = min(loss, key=loss.get)
        assert best == pytest.approx(point_time(free[:1], stalled[:1], np.array([q]))[0], abs=0.02)


def test_saved_model_is_checked(tmp_path):
    sm = StallModel().fit(_runs())
    sm.save(tmp_path / STALL_FILE)
    back = StallModel.load(tmp_path / STALL_FILE)
    df = _runs(seed=1)
    np.testing.assert_allclose(back.proba(df), sm.proba(df))
    d = sm.to_dict()
    with pytest.raises(PerfPredictError, match="other features"):
        StallModel.from_dict({**d, "features": list(FEATURES[:-1])})
    with pytest.raises(PerfPredictError, match="stall schema"):
        StallModel.from_dict({**d, "stall_schema_version": 0})


def test_shipped_stall_model_is_json_beside_the_bundle():
    d = json.loads((default_path() / STALL_FILE).read_text())
    m = StallModel.from_dict(d)
    assert m.classifier_ is not None and m.rows_ >= 100 and 0 < m.stalled_ < m.rows_


def test_mixture_bounds():
    free, stalled = np.full(5, 1.0), np.full(5, 10.0)
    p = np.array([0.0, 0.02, 0.5, 0.98, 1.0])
    lo, hi = mixture_bounds(free, free * 0.8, free * 1.25, stalled, stalled * 0.8, stalled * 1.25, p)
    assert (lo[0], hi[0]) == (0.8, 1.25) and (lo[-1], hi[-1]) == (8.0, 12.5)
    assert hi[1] < 2.0  # a 2 % risk does not stretch the interval over the stalled mode
    assert lo[2] < 1.0 and hi[2] > 10.0  # an even chance covers both
    assert lo[3] > 5.0
    assert (np.diff(lo) >= 0).all() and (np.diff(hi) >= 0).all()


def test_stall_free_guard_reads_a_declared_attribute():
    iv = Intervals()
    assert iv.outside_keys_ == {} and iv.inside_ == {}  # declared, empty before fit
    t, k = np.array([10.0, 10.0]), np.array([1.0, 1.0])
    keys = ["3d:h100:multi-node|pp-cross-node", "3d:h100:multi-node"]
    iv.outside_keys_ = {"3d:h100:multi-node": (-0.1, np.log10(2.0))}
    np.testing.assert_allclose(stall_free(t, k, keys, iv.outside_keys_), [2.0, 10.0])


def test_without_a_learned_stall_the_correction_stands():
    """A stall model that learned no family (a training set without multi-node stalls, e.g. the playbook held out
    by width or scale) changes no prediction: the point and its interval are the correction's, as without one."""
    from dataclasses import replace

    from perfpredict.core.catalog import get_gpu, get_model
    from perfpredict.core.hardware import Cluster
    from perfpredict.core.plan import Plan
    from perfpredict.core.workload import Workload
    from perfpredict.features.descriptors import describe
    from perfpredict.features.frame import plans_frame
    from perfpredict.models.bundle import default_bundle

    b = default_bundle()
    model = get_model("llama-3.2-1b")
    plans = [Plan(framework="nanotron", tp=2, pp=pp, dp=dp, micro_batch=1, grad_accum=8, zero=1)
             for pp, dp in ((4, 8), (8, 4), (1, 32))]
    empty = StallModel().fit(_runs().with_columns(c_nodes=pl.lit(1)))  # no multi-node run: no family in scope
    assert empty.classifier_ is None
    frame = b.compose(describe(plans_frame(model, Cluster(get_gpu("h100-sxm-80gb"), 8, 8),
                                           Workload(objective="pretrain", seq_len=2048, global_batch=256), plans)))
    with_empty, without = replace(b, stall=empty).apply(frame), replace(b, stall=None).apply(frame)
    for k in ("pred_time_s", "pred_time_lo_s", "pred_time_hi_s", "pred_expected_time_s"):
        np.testing.assert_array_equal(with_empty[k], without[k])
    assert (with_empty["pred_stall_p"] == 0).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_calibrated_p_keeps_the_training_stall_rate(seed):
    """The calibrated P(stall) averages the training runs' stall rate (the intercept is the likelihood's for the
    out-of-fold slope), while that slope still shrinks the logit: trained on fewer node counts the classifier is
    over-confident at the one held out. Platt's own intercept, fitted to the out-of-fold values, put the mean at
    0.13-0.17 on these sets against stall rates of 0.18-0.22."""
    df = _runs(seed=seed)
    sm = StallModel().fit(df)
    p = sm.proba(df)
    rate = float(df["truth"].mean())
    assert p.mean() == pytest.approx(rate, abs=0.005)
    assert 0.0 < sm.calibration_["a"] < 1.0
    nodes = df["c_nodes"].to_numpy()
    means = [p[nodes == g].mean() for g in (2, 4, 8, 16)]
    assert means == sorted(means)  # where stalls happen more, P(stall) is higher


def test_intercept_solves_the_mean_equation():
    rng = np.random.default_rng(3)
    z = rng.normal(size=500)
    y = rng.random(500) < 0.1
    for a in (0.2, 0.7, 1.5):
        b = _intercept(a, z, y, start=4.0)
        assert (1.0 / (1.0 + np.exp(-(a * z + b)))).mean() == pytest.approx(y.mean(), abs=1e-9)


def test_ranking_reads_the_throughput_expected_over_the_regimes():
    """The mean of the regimes' throughputs, not the throughput of the mean step: a plan at 1 s per step stall-free
    with a 30 % risk of a 21 s step (a stall charged per micro-batch) still gives 0.71 steps/s expected, more than a
    2 s plan without risk (0.5), although its expected step (7 s) is longer."""
    free, stalled, p = np.array([1.0, 2.0]), np.array([21.0, 2.0]), np.array([0.3, 0.0])
    rate = expected_steps_per_s(free, stalled, p)
    np.testing.assert_allclose(rate, [0.7 + 0.3 / 21.0, 0.5])
    assert rate[0] > rate[1] and free[0] + p[0] * (stalled[0] - free[0]) > free[1]
    # more risk or a longer stall never raises it; no risk: the stall-free throughput
    grid = np.linspace(0.0, 1.0, 11)
    assert (np.diff(expected_steps_per_s(np.ones(11), np.full(11, 5.0), grid)) < 0).all()
    assert (np.diff(expected_steps_per_s(np.ones(5), np.array([1.0, 2.0, 4.0, 8.0, 16.0]), np.full(5, 0.4))) < 0).all()
    np.testing.assert_allclose(expected_steps_per_s(np.array([0.5]), np.array([9.0]), np.array([0.0])), [2.0])
