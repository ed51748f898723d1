"""Regimes, not averages (issue 21 item 3): properties the shipped predictor must honour on random catalog scenarios,
learned correction included.

- With the micro-batches and the data/tensor parallel degrees fixed, doubling the pipeline stages (and the GPUs)
  halves the layers a rank holds: its compute per step must not multiply (the learned layer once made it 10x by
  averaging the stalled and the stall-free runs of deep cross-node pipelines into one ratio).
- The fullest stage sets an uneven pipeline's time: it runs like an even pipeline whose every stage is that full.
- Neighbours in plan space (twice the micro-batch, twice the GPUs) do not differ 10x unless the breakdown names the
  cause (b_stall_s, the pipeline-stall risk: P(stall) x the stall, models.stall).
- The expected step (what `rank` orders by) and its interval never fall as P(stall) rises."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from perfpredict.core.catalog import get_gpu, get_model
from perfpredict.core.frameworks import capability, refusal, runtime_of, stage_layers
from perfpredict.core.hardware import Cluster, node_shape
from perfpredict.core.model import ModelSpec
from perfpredict.core.plan import Plan
from perfpredict.core.schema import STEP_TIME_PARTS
from perfpredict.core.workload import Workload
from perfpredict.features.frame import plans_frame
from perfpredict.models.bundle import default_bundle
from perfpredict.models.stall import StallModel
from perfpredict.predictor.predict import predict_frame

MODELS = ("llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "qwen2.5-7b", "qwen2.5-14b")
GPUS = ("h100-sxm-80gb", "a100-sxm-80gb", "h200-sxm-141gb")
SETTINGS = settings(max_examples=10, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def _cluster(gpu: str, gpus: int) -> Cluster:
    """Nodes of up to 8 GPUs: the largest count up to 8 that divides the total (3-stage pipelines: 6 or 4)."""
    return Cluster(get_gpu(gpu), *node_shape(gpus, max(g for g in range(1, 9) if gpus % g == 0)))


def _plan(fw: str, model: ModelSpec, **kw) -> Plan | None:
    """A plan of `fw` with its own split of the layers over the stages, or None when it cannot run it."""
    pp = kw.get("pp", 1)
    split = stage_layers(capability(fw), model.layers, pp) if pp > 1 else ()
    if split is None:
        return None
    plan = Plan(framework=fw, zero=1, stage_layers=split if len(set(split)) > 1 else (), **kw)
    return None if refusal(plan, model) else plan


def _predict(model: ModelSpec, gpu: str, wl: Workload, plan: Plan) -> dict:
    return predict_frame(plans_frame(model, _cluster(gpu, plan.tp * plan.pp * plan.dp * plan.cp), wl, [plan])).row(
        0, named=True)


@st.composite
def pipelines(draw):
    model = get_model(draw(st.sampled_from(MODELS)))
    fw = draw(st.sampled_from(["megatron", "nanotron"]))
    tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if model.heads % t == 0 and model.kv_heads % t == 0]))
    pp = draw(st.sampled_from([2, 4, 8]))
    mb = draw(st.sampled_from([1, 2, 4]))
    dp = draw(st.sampled_from([1, 2, 4]))
    ga = draw(st.sampled_from([16, 32]))
    wl = Workload(objective=draw(st.sampled_from(["pretrain", "dpo"])), seq_len=draw(st.sampled_from([2048, 4096])),
                  global_batch=dp * mb * ga)
    return model, draw(st.sampled_from(GPUS)), wl, fw, dict(tp=tp, pp=pp, dp=dp, micro_batch=mb, grad_accum=ga,
                                                            sequence_parallel=tp > 1)


@SETTINGS
@given(pipelines())
def test_more_stages_never_multiply_compute_per_rank(case):
    model, gpu, wl, fw, kw = case
    assume(2 * kw["pp"] <= model.layers)
    shallow, deep = _plan(fw, model, **kw), _plan(fw, model, **{**kw, "pp": 2 * kw["pp"]})
    assume(shallow is not None and deep is not None)
    a, b = _predict(model, gpu, wl, shallow), _predict(model, gpu, wl, deep)
    # Each rank of the deeper pipeline holds at most half the layers (plus one where the split is uneven).
    assert b["k_compute_s"] <= a["k_compute_s"], (shallow, deep)
    assert b["b_compute_s"] < 2.0 * a["b_compute_s"], (shallow, deep, a["b_compute_s"], b["b_compute_s"])


@SETTINGS
@given(pipelines(), st.sampled_from([3, 5, 6, 8]))
def test_the_fullest_stage_sets_an_uneven_pipelines_time(case, pp):
    model, gpu, wl, fw, kw = case
    kw = {**kw, "pp": pp}
    split = stage_layers(capability(fw), model.layers, pp)
    assume(split is not None and len(set(split)) > 1)
    # The references are even pipelines; nanotron has none (a plan without a split runs its cost rule,
    # core.frameworks.nanotron_stage_layers, tested in test_memory_nanotron.py).
    assume(not runtime_of(fw).cost_balanced_stages)
    uneven = _plan(fw, model, **kw)
    full = replace(model, name=f"{model.name}-x{max(split)}", layers=max(split) * pp)
    light = replace(model, name=f"{model.name}-x{min(split)}", layers=min(split) * pp)
    even_full, even_light = _plan(fw, full, **kw), _plan(fw, light, **kw)
    assume(uneven is not None and even_full is not None and even_light is not None)
    u, f, li = (_predict(m, gpu, wl, p) for m, p in ((model, uneven), (full, even_full), (light, even_light)))
    # The composition: the uneven pipeline's compute is its fullest stage's (the first/last stages carry the
    # embedding and the head either way).
    assert u["k_compute_s"] == pytest.approx(f["k_compute_s"], rel=0.1)
    assert u["k_compute_s"] > li["k_compute_s"]
    # The prediction: no faster than the pipeline whose stages are all as light as its lightest, no slower than
    # one whose stages are all as full as its fullest, within the learned layer's spread.
    assert li["b_compute_s"] * 0.8 <= u["b_compute_s"] <= f["b_compute_s"] * 1.25, uneven


def _stall_free(row: dict) -> float:
    return sum(row[k] for k in STEP_TIME_PARTS if k != "b_stall_s")


def _named_or_close(a: dict, b: dict, what: str) -> None:
    """Steps within 10x of each other, or the slower one's breakdown names what makes the difference."""
    slow, fast = (a, b) if a["step_time_s"] >= b["step_time_s"] else (b, a)
    assert abs(sum(slow[k] for k in STEP_TIME_PARTS) - slow["step_time_s"]) <= 1e-6 * slow["step_time_s"]
    if slow["step_time_s"] < 10.0 * fast["step_time_s"]:
        return
    assert _stall_free(slow) < 10.0 * fast["step_time_s"], f"{what}: a 10x jump with no named cause"


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(pipelines(), st.sampled_from(["micro_batch", "gpus"]))
def test_neighbours_do_not_jump_10x_without_a_named_cause(case, axis):
    model, gpu, wl, fw, kw = case
    kw = {**kw, "pp": min(kw["pp"], model.layers)}
    if axis == "micro_batch":  # twice the micro-batch, half the accumulation: the same samples per step
        other = {**kw, "micro_batch": 2 * kw["micro_batch"], "grad_accum": kw["grad_accum"] // 2}
    else:  # twice the data-parallel replicas (and GPUs), half the accumulation: the same global batch
        other = {**kw, "dp": 2 * kw["dp"], "grad_accum": kw["grad_accum"] // 2}
    a, b = _plan(fw, model, **kw), _plan(fw, model, **other)
    assume(a is not None and b is not None)
    _named_or_close(_predict(model, gpu, wl, a), _predict(model, gpu, wl, b), axis)


def test_deep_cross_node_pipeline_names_its_stall_risk():
    """Issue 21's case (a 28-layer 3B model at tp4 dp4 mb4, pp 8 on 128 GPUs vs pp 16 on 256): compute per rank
    does not multiply, and whatever the learned layer adds beyond the stall-free regime shows as the stall risk."""
    model = get_model("llama-3.2-3b")
    wl = Workload(objective="pretrain", seq_len=4096, global_batch=512)
    rows = [_predict(model, "h100-sxm-80gb", wl, _plan("nanotron", model, tp=4, pp=pp, dp=4, micro_batch=4,
                                                       grad_accum=32, sequence_parallel=True)) for pp in (8, 16)]
    assert rows[1]["b_compute_s"] < 2.0 * rows[0]["b_compute_s"]
    for r in rows:
        assert np.isclose(sum(r[k] for k in STEP_TIME_PARTS), r["step_time_s"])
    _named_or_close(rows[0], rows[1], "pp 8 -> 16")
    assert pl.Series([r["b_stall_s"] for r in rows]).min() >= 0.0


class _FixedRisk(StallModel):
    """The shipped stall model with P(stall) forced to one value on every plan."""

    def __init__(self, base: StallModel, p: float):
        self.__dict__.update(base.__dict__)
        self.p = p

    def proba(self, df: pl.DataFrame, scope: np.ndarray | None = None) -> np.ndarray:
        return np.full(df.height, self.p)


@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(pipelines())
def test_expected_step_is_monotone_in_stall_risk(case):
    """Expected step = stall-free x (1 - p) + stalled x p with stalled >= stall-free: it (what `rank` orders by)
    and the mixture's interval never fall as P(stall) rises; the point is one of the two regimes, the stall-free
    step at p = 0 and the stalled one at p = 1 (models.stall.point_time)."""
    model, gpu, wl, fw, kw = case
    plan = _plan(fw, model, **kw)
    assume(plan is not None)
    b = default_bundle()
    assert b.stall is not None, "the shipped predictor carries its stall model (stall.json)"
    flat = plans_frame(model, _cluster(gpu, plan.tp * plan.pp * plan.dp * plan.cp), wl, [plan])
    rows = [predict_frame(flat, bundle=replace(b, stall=_FixedRisk(b.stall, p))).row(0, named=True)
            for p in (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)]
    for key in ("expected_time_s", "step_time_lo_s", "step_time_hi_s"):
        v = [r[key] for r in rows]
        assert all(x <= y * (1 + 1e-6) for x, y in zip(v, v[1:], strict=False)), (key, v)
    assert rows[0]["step_time_s"] == pytest.approx(rows[0]["stall_free_time_s"])
    assert rows[-1]["step_time_s"] == pytest.approx(rows[-1]["stalled_time_s"])
    for r in rows:
        assert r["step_time_s"] in (pytest.approx(r["stall_free_time_s"]), pytest.approx(r["stalled_time_s"]))
        assert r["step_time_lo_s"] <= r["expected_time_s"] <= r["step_time_hi_s"]
        assert r["step_time_lo_s"] <= r["step_time_s"] <= r["step_time_hi_s"]
        assert np.isclose(sum(r[k] for k in STEP_TIME_PARTS), r["step_time_s"])
