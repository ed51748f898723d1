"""Physics the shipped predictor must honour on random scenarios, learned correction included: more bandwidth is
never slower, sequence parallelism moves no FLOPs (the step stays within the norms' share), recompute and a live
reference cost time, more micro-batches per step never make the step shorter."""

from __future__ import annotations

import numpy as np
import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfpredict.core.catalog import get_gpu, get_model
from perfpredict.core.hardware import Cluster
from perfpredict.core.workload import Workload
from perfpredict.features.frame import plans_frame
from perfpredict.features.plans import enumerate_plans
from perfpredict.predictor.predict import predict_frame

c = pl.col
MODELS = ("llama-3.2-1b", "llama-3.1-8b", "qwen2.5-14b", "mistral-7b", "llama-3.1-70b")
GPUS = ("h100-sxm-80gb", "a100-sxm-80gb", "l40s", "h200-sxm-141gb")
SETTINGS = settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def plan_frames(draw) -> pl.DataFrame:
    model = get_model(draw(st.sampled_from(MODELS)))
    cluster = Cluster(get_gpu(draw(st.sampled_from(GPUS))), 8, draw(st.sampled_from([1, 2, 4])))
    wl = Workload(objective="dpo", seq_len=draw(st.sampled_from([1024, 4096])), global_batch=64)
    plans = list(enumerate_plans(model, cluster, wl))
    seed = draw(st.integers(0, 2**16))
    pick = np.random.default_rng(seed).choice(len(plans), size=min(40, len(plans)), replace=False)
    return plans_frame(model, cluster, wl, [plans[i] for i in pick])


def _time(flat: pl.DataFrame) -> np.ndarray:
    return predict_frame(flat)["step_time_s"].to_numpy()


@SETTINGS
@given(plan_frames(), st.sampled_from([1.5, 4.0, 30.0]))
def test_more_bandwidth_is_never_slower(flat, k):
    fast = flat.with_columns(c_intra_bw_gb_per_s=c("c_intra_bw_gb_per_s") * k,
                             c_inter_bw_gb_per_s=c("c_inter_bw_gb_per_s") * k)
    assert np.all(_time(fast) <= _time(flat) * (1 + 1e-9))


@SETTINGS
@given(plan_frames())
def test_slower_inter_node_link_is_slower_where_traffic_crosses_nodes(flat):
    slow = flat.with_columns(c_inter_bw_gb_per_s=c("c_inter_bw_gb_per_s") / 8.0)
    t0, t1 = _time(flat), _time(slow)
    assert np.all(t1 >= t0 * (1 - 1e-9))
    crossing = predict_frame(flat).select(c("d_dp_cross_node") | c("d_tp_cross_node")).to_series().to_numpy()
    if crossing.any():
        assert np.all(t1[crossing] > t0[crossing])


@SETTINGS
@given(plan_frames())
def test_sequence_parallelism_moves_no_flops(flat):
    tp = flat.filter(c("p_tp") > 1)
    if not tp.height:
        return
    ratio = _time(tp.with_columns(p_sp=pl.lit(True))) / _time(tp.with_columns(p_sp=pl.lit(False)))
    # SP removes the redundant norm/residual work of tp ranks (a tenth to a quarter of a layer's time at tp 8) and
    # moves the same bytes (all-gather + reduce-scatter for each all-reduce, timed as the all-reduce they replace):
    # never a halving, never more than a few percent slower (the learned norm kernels are not monotone in size).
    assert np.all((ratio > 0.6) & (ratio < 1.05)), ratio.min()


@SETTINGS
@given(plan_frames())
def test_recompute_costs_time(flat):
    t = [_time(flat.with_columns(p_recompute=pl.lit(r))) for r in ("none", "selective", "full")]
    assert np.all(t[0] <= t[1] * (1 + 1e-9)) and np.all(t[1] <= t[2] * (1 + 1e-9))
    assert np.all(t[2] > t[0])


@SETTINGS
@given(plan_frames())
def test_live_reference_costs_more_than_precomputed(flat):
    live = _time(flat.with_columns(w_reference=pl.lit("live")))
    pre = _time(flat.with_columns(w_reference=pl.lit("precomputed")))
    assert np.all(live > pre)


@SETTINGS
@given(plan_frames())
def test_more_micro_batches_never_shorten_the_step(flat):
    double = flat.with_columns(p_grad_accum=c("p_grad_accum") * 2, w_global_batch=c("w_global_batch") * 2)
    assert np.all(_time(double) >= _time(flat) * (1 - 1e-9))


def test_every_plan_keeps_the_compositions_order_against_its_physics_twins():
    """Every legal plan of the scenario where a retrained correction once reversed a live and a precomputed
    reference (Llama-3.2-1B DPO on 8 A100, 4k tokens: FSDP2 tp4 dp2, 7.53 s live against 7.83 s precomputed):
    the applicability weight leaves the physics knobs out (models.plan_model.PHYSICS_KNOBS), so twins share it and
    the monotone correction keeps the composition's order."""
    model, cluster = get_model("llama-3.2-1b"), Cluster(get_gpu("a100-sxm-80gb"), 8, 1)
    wl = Workload(objective="dpo", seq_len=4096, global_batch=64)
    flat = plans_frame(model, cluster, wl, list(enumerate_plans(model, cluster, wl)))
    live = _time(flat.with_columns(w_reference=pl.lit("live")))
    pre = _time(flat.with_columns(w_reference=pl.lit("precomputed")))
    assert np.all(live > pre), int((live <= pre).sum())
    t = [_time(flat.with_columns(p_recompute=pl.lit(r))) for r in ("none", "full")]
    assert np.all(t[1] > t[0]), int((t[1] <= t[0]).sum())
