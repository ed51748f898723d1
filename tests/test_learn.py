"""Unit tests of the learned layer's parts: the composition's kernel counts against a hand count, split-conformal
bounds, the OOM margin, the per-domain applicability weight and the never-probed-hardware interval."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from perfpredict.core.catalog import get_gpu, get_model
from perfpredict.core.hardware import Cluster
from perfpredict.core.plan import Plan
from perfpredict.core.workload import Workload
from perfpredict.features.descriptors import describe
from perfpredict.features.frame import plans_frame
from perfpredict.models.compose import kernel_queries
from perfpredict.models.plan_model import Correction, Intervals, conformal_quantiles

c = pl.col


def test_kernel_counts_of_a_known_plan_match_a_hand_count():
    """Llama-3.2-1B (16 layers, hidden 2048, 32 heads / 8 KV heads of 64, ffn 8192; the catalog's published
    config), SFT, seq 2048, TP 2 x DP 4, one sequence per micro-batch, 2 micro-batches per step, Megatron."""
    model = get_model("llama-3.2-1b")
    desc = describe(plans_frame(model, Cluster(get_gpu("h100-sxm-80gb"), 8, 1),
                                Workload(objective="sft", seq_len=2048, global_batch=8),
                                [Plan(tp=2, dp=4, micro_batch=1, grad_accum=2, framework="megatron")]))
    q = kernel_queries(desc)
    gemm_fwd = q.filter((c("op") == "gemm") & (c("pass_") == "fwd"))
    # Four layer GEMMs x 16 layers x 2 micro-batches, one forward each (no recompute, no reference) + the head.
    layer = gemm_fwd.filter(c("n") != model.vocab // 2)
    assert layer["count"].to_list() == [32.0] * 4
    assert sorted(layer["n"].to_list()) == sorted([(32 + 2 * 8) * 64 // 2, 2048, 2 * 8192 // 2, 2048])
    assert gemm_fwd.filter(c("n") == model.vocab // 2)["count"].to_list() == [2.0]
    # TP: 2 all-reduces forward + 2 backward per layer, of the micro-batch's activations (2048 x 2048 x 2 bytes).
    tp = q.filter(c("part") == "tp")
    assert tp["bytes"].to_list() == [2048 * 2048 * 2] and tp["count"].to_list() == [16 * 2 * 4.0]
    assert tp["world_size"].to_list() == [2]
    # DP: one all-reduce of this rank's gradients per step over the 4 replicas.
    dp = q.filter(c("part") == "dp")
    assert dp["count"].to_list() == [1.0] and dp["world_size"].to_list() == [4]
    assert q.filter(c("op") == "adam")["count"].to_list() == [1.0]


def test_conformal_bounds_cover_fresh_draws():
    rng = np.random.default_rng(0)
    lo, hi = conformal_quantiles(rng.normal(0.0, 0.1, 2000), 0.9)
    fresh = rng.normal(0.0, 0.1, 20000)
    assert 0.88 <= np.mean((fresh >= lo) & (fresh <= hi)) <= 0.92
    assert conformal_quantiles(np.array([0.1, 0.2]), 0.9) == (-0.3, 0.3)  # too few residuals: a wide default


def _frame(n: int, framework: str, hw: str, x: np.ndarray) -> pl.DataFrame:
    return pl.DataFrame({"p_framework": [framework] * n, "g_name": [hw] * n, "c_nodes": [1] * n, "x": x,
                         "k_step_s": np.ones(n)})


def test_applicability_is_per_domain(monkeypatch):
    """A row near another domain's training rows gets no weight; a training row of its own domain gets full."""
    monkeypatch.setattr(Correction, "features", lambda self, df: df.select("x"))
    rng = np.random.default_rng(2)
    train = pl.concat([_frame(50, "megatron", "a100-sxm-80gb", rng.normal(0, 1, 50)),
                       _frame(50, "deepspeed", "h100-sxm-80gb", rng.normal(10, 1, 50))])
    corr = Correction(kind="time").fit(train, np.full(100, 1.5))
    near_own = _frame(1, "megatron", "a100-sxm-80gb", np.array([0.0]))
    near_other = _frame(1, "megatron", "a100-sxm-80gb", np.array([10.0]))
    unseen = _frame(1, "nanotron", "l40s", np.array([0.0]))
    multi = _frame(1, "megatron", "a100-sxm-80gb", np.array([0.0])).with_columns(c_nodes=pl.lit(2))
    assert corr.weight(near_own)[0] == pytest.approx(1.0)
    assert corr.weight(multi)[0] == 0.0  # learned on one node only: says nothing about crossing nodes
    assert corr.weight(near_other)[0] == 0.0
    assert corr.weight(unseen)[0] == 0.0 and corr.predict(unseen)[0] == 1.0  # the composition itself


def test_a_physics_twin_shares_the_weight_so_the_correction_keeps_the_compositions_order(monkeypatch):
    """A plan and its twin with a live reference differ in one feature the correction is monotone in (TIME_MONOTONE);
    the applicability weight leaves those knobs out (PHYSICS_KNOBS), so both get the same weight and the corrected
    times keep the composition's order. With the knob in the distance, a live reference where training saw only
    precomputed ones got weight 0 and the composition alone (2.0 s) against its twin's corrected 1.5 x 1.5 = 2.25 s:
    the shipped 1B FSDP2 tp4 on 8 A100 predicted 7.53 s live against 7.83 s precomputed."""
    monkeypatch.setattr(Correction, "features", lambda self, df: df.select("x", "f_reference"))
    rng = np.random.default_rng(5)
    train = _frame(60, "fsdp2", "a100-sxm-80gb", rng.normal(0, 1, 60)).with_columns(f_reference=pl.lit(0.0))
    corr = Correction(kind="time").fit(train, np.full(60, 1.5))
    assert "f_reference" not in corr.domain_features_ and "x" in corr.domain_features_
    pre = _frame(1, "fsdp2", "a100-sxm-80gb", np.array([0.0])).with_columns(f_reference=pl.lit(0.0),
                                                                            k_step_s=pl.lit(1.5))
    live = pre.with_columns(f_reference=pl.lit(1.0), k_step_s=pl.lit(2.0))  # the composition charges the reference
    assert corr.weight(live)[0] == corr.weight(pre)[0] == pytest.approx(1.0)
    assert corr.predict(live)[0] > corr.predict(pre)[0]


def test_a_domain_measured_on_a_few_rows_gets_no_correction(monkeypatch):
    """Below MIN_DOMAIN_ROWS training rows a domain is not measured for the correction: its rows get the
    composition (ms-swift's 3 DeepSpeed rows on A100 made a held-out model worse than the composition)."""
    from perfpredict.models.plan_model import MIN_DOMAIN_ROWS

    monkeypatch.setattr(Correction, "features", lambda self, df: df.select("x"))
    rng = np.random.default_rng(4)
    few = MIN_DOMAIN_ROWS - 1
    train = pl.concat([_frame(50, "megatron", "a100-sxm-80gb", rng.normal(0, 1, 50)),
                       _frame(few, "deepspeed", "a100-sxm-80gb", rng.normal(0, 1, few))])
    corr = Correction(kind="time").fit(train, np.full(50 + few, 1.5))
    assert corr.weight(_frame(1, "megatron", "a100-sxm-80gb", np.array([0.0])))[0] == pytest.approx(1.0)
    sparse = _frame(1, "deepspeed", "a100-sxm-80gb", np.array([0.0]))
    assert corr.weight(sparse)[0] == 0.0 and corr.predict(sparse)[0] == 1.0


def test_a_borrowed_spread_is_widened_by_how_far_borrowed_spreads_missed_on_the_measured_keys():
    """Issue 21 item 1: a key never measured borrows its nearest keys' composition spread, widened by the transfer
    margin: each measured key treated as unmeasured, the share of its residuals outside the spread it would have
    borrowed, each side's (1 + coverage) / 2 quantile with every key weighing the same. Where the families' biases
    differ, a new family's runs are then covered about as often as the interval says; a measured key keeps its own
    spread; with one measured key there is nothing to measure the transfer on (no margin); old bundles read none."""
    rng = np.random.default_rng(11)
    # Three measured families on a GPU class whose compositions are biased differently (0, +0.1, -0.06 in log10).
    fams = {"3d:gpu": 0.0, "zero:gpu": 0.1, "moe:gpu": -0.06}
    keys = [k for k in fams for _ in range(400)]
    comp = np.concatenate([rng.normal(b, 0.04, 400) for b in fams.values()])
    iv = Intervals().fit(keys, comp, comp, oof_weight=np.zeros(len(comp)))
    assert iv.transfer_["hi"] > 0.03 and iv.transfer_["lo"] > 0.03
    # A fourth family, biased like the measured ones differ: covered about as often as stated, not half of it.
    new = rng.normal(0.1, 0.04, 2000)
    lo, hi = iv.bounds(["nano:gpu"] * new.size, np.zeros(new.size))
    covered = np.mean((lo <= new) & (new <= hi))
    plain = np.mean((min(iv.outside_keys_["3d:gpu"][0], 0) <= new) & (new <= max(iv.outside_keys_["3d:gpu"][1], 0)))
    assert plain < 0.6 < 0.85 <= covered
    assert hi[0] - lo[0] < np.log10(3.0)  # still an interval a user can act on
    # A measured key keeps its own spread.
    lo, hi = iv.bounds(["zero:gpu"], np.zeros(1))
    assert (lo[0], hi[0]) == pytest.approx((min(iv.outside_keys_["zero:gpu"][0], 0), iv.outside_keys_["zero:gpu"][1]))
    assert Intervals.from_dict(iv.to_dict()).transfer_ == iv.transfer_
    assert Intervals().fit(["3d:gpu"] * 100, comp[:100], comp[:100]).transfer_ == {}
    old = {k: v for k, v in iv.to_dict().items() if k != "transfer"}
    assert Intervals.from_dict(old).transfer_ == {}


def test_inside_bounds_come_from_the_residuals_of_rows_as_applicable_as_the_row():
    """Issue 21 item 1: the correction is surer near its training rows, so an inside row's bounds are the
    split-conformal bounds of the out-of-fold residuals in its weight band (WEIGHT_BANDS) where that band holds
    enough of them, else its key's: sharp at the core, wider at the fringe, both calibrated."""
    from perfpredict.models.plan_model import WEIGHT_BANDS

    rng = np.random.default_rng(12)
    key = "zero:cpu"
    w = np.r_[rng.uniform(0.5, WEIGHT_BANDS[1], 300), rng.uniform(WEIGHT_BANDS[1], 1.0, 900)]
    oof = np.r_[rng.normal(0, 0.12, 300), rng.normal(0, 0.04, 900)]
    iv = Intervals().fit([key] * w.size, oof, rng.normal(0, 0.2, w.size), oof_weight=w)
    lo, hi = iv.bounds([key] * 3, np.array([0.6, 0.9, 1.0]))
    assert hi[1] - lo[1] < 0.5 * (hi[0] - lo[0])  # the core is sharper than the fringe
    assert (lo[1], hi[1]) == (lo[2], hi[2])
    for at, sd in ((0.6, 0.12), (0.9, 0.04)):  # each band covers its own rows about 90 %
        new = rng.normal(0, sd, 4000)
        b_lo, b_hi = iv.bounds([key], np.array([at]))
        assert 0.85 <= np.mean((b_lo[0] <= new) & (new <= b_hi[0])) <= 0.95
    assert Intervals.from_dict(iv.to_dict()).bounds([key] * 3, np.array([0.6, 0.9, 1.0]))[1] == pytest.approx(hi)
    old = {k: v for k, v in iv.to_dict().items() if k != "inside_bands"}  # a bundle from before: the key's bounds
    assert Intervals.from_dict(old).bounds([key], np.ones(1))[1][0] == pytest.approx(iv.inside_[key][1])
    # Too few residuals in a band: its rows keep the key's bounds.
    few = Intervals().fit([key] * 310, np.r_[oof[:10], oof[300:600]], np.zeros(310), oof_weight=np.r_[w[:10], w[300:600]])
    assert few.bounds([key], np.array([0.6]))[1][0] == pytest.approx(few.inside_[key][1])


def test_never_probed_hardware_gets_its_own_wider_interval_per_device_class():
    rng = np.random.default_rng(3)
    keys = ["3d:h100-sxm-80gb:single-node"] * 200
    iv = Intervals().fit(keys, rng.normal(0, 0.05, 200), rng.normal(0, 0.1, 200))
    iv.fit_unseen_hardware(np.r_[rng.normal(0.2, 0.3, 200), rng.normal(0, 0.02, 200)],
                           hardware=["a100-sxm-80gb"] * 200 + ["cpu"] * 200)
    lo, hi = iv.bounds(keys[:2], np.array([1.0, 1.0]), np.array([False, True]))
    assert hi[1] - lo[1] > 3 * (hi[0] - lo[0])  # a GPU row: the held-out GPUs' spread, not the CPU's
    assert Intervals.from_dict(iv.to_dict()).unseen_ == iv.unseen_
    old = {**iv.to_dict(), "unseen_hardware": [-0.5, 0.5]}  # a bundle from before: one pooled pair
    assert Intervals.from_dict(old).bounds(keys[:1], np.ones(1), np.ones(1, bool))[1][0] == pytest.approx(0.5)


def test_intervals_use_applicable_residuals_inside_and_the_nearest_measured_composition_outside():
    """Inside bounds come from residuals where the correction applied in its fold; a key without enough of them,
    and every key at weight 0, gets the composition's spread in that key; a key never measured gets the spread of
    its nearest measured keys (same regime, device class, family, hardware, node regime), never one pooled over
    every source."""
    rng = np.random.default_rng(5)
    a, b = "3d:a100-sxm-80gb:single-node", "3d:h100-sxm-80gb:multi-node"
    ppx = b + "|pp-cross-node"
    cpu = "zero:cpu:single-node"
    keys = [a] * 300 + [b] * 300 + [ppx] * 300 + [cpu] * 300
    oof = np.concatenate([rng.normal(0, 0.02, 300), rng.normal(0, 0.5, 300), rng.normal(0, 0.5, 300),
                          rng.normal(0, 0.02, 300)])
    comp = np.concatenate([rng.normal(0, 0.1, 300), rng.normal(0, 0.3, 300), rng.normal(0.6, 0.4, 300),
                           rng.normal(0, 2.0, 300)])
    w = np.concatenate([np.ones(300), np.zeros(600), np.ones(300)])  # the correction applied in a and cpu
    iv = Intervals().fit(keys, oof, comp, oof_weight=w)
    rows = [a, a, b, ppx, "zero:h100-sxm-80gb:single-node", "3d:a100-sxm-80gb:multi-node|pp-cross-node",
            "trl:rtx-4090:single-node", b + "|other"]
    lo, hi = iv.bounds(rows, np.array([1.0, 0, 1, 1, 0, 0, 0, 1]))
    width = hi - lo
    assert width[0] < 0.15 < width[1]  # applicable: the corrected spread; weight 0: the composition's in a
    assert (lo[2], hi[2]) == pytest.approx(iv.outside_keys_[b])  # no applicable residual in b: its own spread
    assert hi[3] > hi[2] + 0.1  # the cross-node pipeline key has its own (shifted, wider) spread
    # A key never measured borrows its nearest keys' spread, widened by the transfer margin (Intervals.transfer_).
    def lent(lo_hi: tuple[float, float]) -> tuple[float, float]:
        return min(lo_hi[0], 0.0) - iv.transfer_["lo"], max(lo_hi[1], 0.0) + iv.transfer_["hi"]

    # Another family on a measured GPU: that GPU's measured keys of its regime (b, not the cross-node stalls).
    assert (lo[4], hi[4]) == pytest.approx(lent(iv.outside_keys_[b]))
    assert (lo[5], hi[5]) == pytest.approx(lent(iv.outside_keys_[ppx]))  # a cross-node pipeline: the nearest such
    # A GPU never measured, a family never measured: the GPU key of its regime and node count (a), never the CPU's.
    assert (lo[6], hi[6]) == pytest.approx(lent(iv.outside_keys_[a]))
    assert hi[6] < iv.outside_keys_[cpu][1]
    # A regime never seen: its own domain's keys (the widest of them).
    assert (lo[7], hi[7]) == pytest.approx(lent((min(iv.outside_keys_[b][0], iv.outside_keys_[ppx][0]),
                                                 max(iv.outside_keys_[b][1], iv.outside_keys_[ppx][1]))))
    back = Intervals.from_dict(iv.to_dict())
    assert np.allclose(back.bounds([ppx], np.ones(1))[1], hi[3])


def test_gpu_dispatch_hides_behind_device_time_only_where_fitted_so():
    """A GPU runs kernels asynchronously: with gpu_hidden = 1 (fitted per runtime, e.g. Megatron) host dispatch
    costs only what exceeds device time; 0 (and any old bundle without the key) adds it; a CPU always adds it."""
    from perfpredict.models.bundle import default_kernels
    from perfpredict.models.compose import compose

    big = describe(plans_frame(get_model("llama-3.1-8b"), Cluster(get_gpu("h100-sxm-80gb"), 8, 1),
                               Workload(objective="dpo", seq_len=4096, global_batch=64),
                               [Plan(tp=8, micro_batch=1, grad_accum=64), Plan(dp=8, zero=3, framework="fsdp",
                                                                               micro_batch=1, grad_accum=8)]))
    k = default_kernels()
    add = compose(big, k, launch_floor={"gpu": 1e-4, "cpu": 1e-4}, canonical=False)
    hid = compose(big, k, launch_floor={"gpu": 1e-4, "cpu": 1e-4, "gpu_hidden:megatron": 1.0}, canonical=False)
    device = (hid["k_compute_s"] + hid["k_tp_s"] + hid["k_cp_s"] + hid["k_ep_s"]).to_numpy()
    host = add["k_launch_s"].to_numpy()
    assert (host > 0).all()
    # Megatron's row: only the dispatch time beyond the device's; FSDP (no per-runtime fit): still added.
    assert hid["k_launch_s"][0] == pytest.approx(max(host[0] - device[0], 0.0))
    assert hid["k_launch_s"][1] == pytest.approx(host[1])
    assert (hid["k_step_s"].to_numpy() <= add["k_step_s"].to_numpy() + 1e-12).all()
    cpu = describe(plans_frame(get_model("llama-3.2-1b"), Cluster(get_gpu("cpu"), 2, 1),
                               Workload(objective="dpo", seq_len=64, global_batch=2, precision="fp32"),
                               [Plan(dp=2, framework="megatron", micro_batch=1)]))
    a = compose(cpu, k, launch_floor={"gpu": 1e-4, "cpu": 1e-4}, canonical=False)["k_launch_s"][0]
    h = compose(cpu, k, launch_floor={"gpu": 1e-4, "cpu": 1e-4, "gpu_hidden": 1.0, "gpu_hidden:megatron": 1.0},
                canonical=False)["k_launch_s"][0]
    assert h == pytest.approx(a) and a > 0


def test_fit_launch_floor_recovers_each_runtimes_host_model():
    """Steps made by the composition itself with Megatron's dispatch hidden (6e-5 s) and FSDP's added (2e-5 s) are
    explained back: the fit picks each runtime's floor and whether it hides, not one pooled compromise."""
    from perfpredict.models import compose as C
    from perfpredict.models.bundle import default_kernels
    from perfpredict.models.calibration import LaunchFloor

    plans = [Plan(tp=t, dp=8 // t, micro_batch=m, grad_accum=g) for t in (1, 2, 4, 8) for m in (1, 2)
             for g in (1, 4)]
    plans += [Plan(dp=8, zero=3, framework="fsdp", micro_batch=m, grad_accum=g) for m in (1, 2, 4) for g in (1, 8)]
    desc = describe(plans_frame(get_model("llama-3.2-1b"), Cluster(get_gpu("h100-sxm-80gb"), 8, 1),
                                Workload(objective="dpo", seq_len=1024, global_batch=64), plans))
    desc = pl.concat([desc] * 17)  # at least MIN_RUNTIME_ROWS per runtime
    k = default_kernels()
    truth = {"gpu": 2e-5, "cpu": 1e-4, "gpu:megatron": 6e-5, "gpu_hidden:megatron": 1.0}
    y = C._compose(desc, k, truth)["k_step_s"].to_numpy()
    est = LaunchFloor(k)
    assert est.fit(desc, y) is est
    fl = est.floors_
    assert fl["gpu:megatron"] == pytest.approx(6e-5) and fl["gpu_hidden:megatron"] == 1.0
    assert fl["gpu:fsdp"] == pytest.approx(2e-5) and fl["gpu_hidden:fsdp"] == 0.0


def test_pooled_launch_floor_on_the_grids_edge_keeps_the_prior():
    """The pooled GPU floor is what a runtime with no steps of its own is charged. Steps slower than any launch cost
    explains (composed with 4x the grid's largest floor) put the search's optimum on its last point: the pool keeps
    compose.LAUNCH_FLOOR_S's prior instead of lending that slowness to other runtimes (held out by hardware, A100
    took Megatron's steps with it and Megatron was charged nanotron's 120 us per kernel: docs/accuracy.md, vtrain
    101.9 %). An optimum inside the grid is still fitted."""
    from perfpredict.models import compose as C
    from perfpredict.models.bundle import default_kernels
    from perfpredict.models.calibration import LAUNCH_GRID_S, LaunchFloor

    desc = describe(plans_frame(get_model("llama-3.2-1b"), Cluster(get_gpu("h100-sxm-80gb"), 8, 1),
                                Workload(objective="dpo", seq_len=1024, global_batch=64),
                                [Plan(tp=t, dp=8 // t, micro_batch=1, grad_accum=g) for t in (1, 2, 4, 8)
                                 for g in (1, 4)]))
    desc = pl.concat([desc] * 3)  # 24 steps: the pool is fitted, no runtime of its own (< MIN_RUNTIME_ROWS)
    k = default_kernels()
    slow = C._compose(desc, k, {"gpu": 4 * max(LAUNCH_GRID_S), "cpu": 1e-4})["k_step_s"].to_numpy()
    assert LaunchFloor(k).fit(desc, slow).floors_["gpu"] == C.LAUNCH_FLOOR_S["gpu"]
    inside = C._compose(desc, k, {"gpu": LAUNCH_GRID_S[-2], "cpu": 1e-4})["k_step_s"].to_numpy()
    assert LaunchFloor(k).fit(desc, inside).floors_["gpu"] == LAUNCH_GRID_S[-2]


def test_step_term_estimators_follow_the_sklearn_contract():
    """LaunchFloor and TrlCalibration: hyper-parameters only in __init__, clone() and set_params work, fit returns
    self with `_` attributes, predict is the composition with the fitted values; no kernels is one clear error."""
    from sklearn.base import clone

    from perfpredict.core.errors import PerfPredictError
    from perfpredict.models.bundle import default_bundle
    from perfpredict.models.calibration import LaunchFloor, TrlCalibration
    from perfpredict.models.compose import compose

    b = default_bundle()
    desc = describe(plans_frame(get_model("llama-3.2-1b"), Cluster(get_gpu("h100-sxm-80gb"), 8, 1),
                                Workload(objective="dpo", seq_len=1024, global_batch=64),
                                [Plan(tp=t, dp=8 // t, micro_batch=1, grad_accum=g) for t in (1, 2, 4, 8)
                                 for g in (1, 4)]))
    desc = pl.concat([desc] * 3)
    y = compose(desc, b.kernels, launch_floor={"gpu": 3e-5, "cpu": 1e-4}, canonical=False)["k_step_s"].to_numpy()
    for est, fitted in ((LaunchFloor(b.kernels, min_class_rows=10), "floors_"),
                        (TrlCalibration(b.kernels, launch_floor=b.launch_floor_s), "calibration_")):
        twin = clone(est)
        assert twin is not est and twin.get_params().keys() == est.get_params().keys()
        assert not hasattr(twin, fitted) and twin.get_params()["kernels"] is not est.kernels
        assert twin.set_params(kernels=b.kernels) is twin and twin.kernels is b.kernels
        assert twin.fit(desc, y) is twin and hasattr(twin, fitted) and not hasattr(est, fitted)
        floor = twin.floors_ if fitted == "floors_" else twin.launch_floor
        cal = twin.calibration_ if fitted == "calibration_" else None
        want = compose(desc, b.kernels, launch_floor=floor, trl_calibration=cal, canonical=False)["k_step_s"]
        assert np.array_equal(twin.predict(desc), want.to_numpy())
        with pytest.raises(PerfPredictError, match="needs fitted kernel models"):
            clone(est).set_params(kernels=None).fit(desc, y)
        with pytest.raises(PerfPredictError, match="one per run"):
            twin.fit(desc, y[:-1])
    assert LaunchFloor(b.kernels, min_class_rows=10).fit(desc, y).floors_["gpu"] == 3e-5


def test_memory_intervals_are_per_framework_family_and_device_never_pooled_over_families():
    """A memory interval key names the framework family and device class: a DeepSpeed plan on a GPU takes the
    ZeRO family's GPU spread, not one pooled with nanotron's; TRL on a GPU (never measured there) takes its kin's
    (the ZeRO family's runtimes), not the 3-D engines'. A bundle fitted with device-only keys still answers."""
    from perfpredict.models.plan_model import Correction

    df = pl.DataFrame({"p_framework": ["deepspeed", "fsdp", "nanotron", "trl+fsdp", "fsdp", "trl"],
                       "g_name": ["h100-sxm-80gb", "a100-sxm-80gb", "h100-sxm-80gb", "h100-sxm-80gb", "cpu", "cpu"]})
    keys = Correction(kind="memory", domain="device").interval_keys(df)
    assert keys == ["zero:gpu", "zero:gpu", "3d:gpu", "trl:gpu", "zero:cpu", "trl:cpu"]
    rng = np.random.default_rng(3)
    fit_keys = ["3d:gpu"] * 300 + ["zero:gpu"] * 60 + ["trl:cpu"] * 100
    comp = np.concatenate([rng.normal(0.15, 0.25, 300), rng.normal(0.05, 0.05, 60), rng.normal(0, 0.01, 100)])
    iv = Intervals().fit(fit_keys, comp, comp, oof_weight=np.zeros(len(comp)))
    lo, hi = iv.bounds(keys, np.zeros(len(keys)))
    assert (lo[0], hi[0]) == pytest.approx(iv.outside_keys_["zero:gpu"])
    assert hi[0] < iv.outside_keys_["3d:gpu"][1] - 0.2
    # TRL on a GPU: its kin's spread (widened by the transfer margin, as every borrowed spread)
    zlo, zhi = iv.outside_keys_["zero:gpu"]
    assert (lo[3], hi[3]) == pytest.approx((min(zlo, 0.0) - iv.transfer_["lo"], max(zhi, 0.0) + iv.transfer_["hi"]))
    legacy = Intervals.from_dict({"inside": {"gpu": [-0.1, 0.2]}, "domain": {"gpu": [-0.1, 0.2]},
                                  "outside_keys": {"gpu": [0.0, 0.3]}})
    lo, hi = legacy.bounds(["zero:gpu"], np.ones(1))
    assert (lo[0], hi[0]) == pytest.approx((-0.1, 0.2))
    # A family never measured on the device borrows the nearest's spread, widened to hold the point: another
    # family's bias (nanotron's reserved peaks, 1.06-2.2x) says how far off, not which way.
    shifted = Intervals().fit(["3d:gpu"] * 100, np.full(100, 0.3), rng.normal(0.3, 0.05, 100))
    lo, hi = shifted.bounds(["zero:gpu", "3d:gpu"], np.zeros(2))
    # The measured family's own bias widens its interval upward but no longer lifts it off the point: the bias of
    # the composition on the key's other rows is not known to carry (the playbook's 8B vs its 1B).
    assert lo[0] == 0.0 and hi[0] == pytest.approx(hi[1]) and lo[1] == 0.0 and hi[1] > 0.3
    legacy = Intervals.from_dict({"inside": {"cpu": [-0.1, 0.3]}, "domain": {"cpu": [-0.1, 0.3]},
                                  "outside_keys": {"cpu": [-0.1, 0.3], "trl:cpu": [-0.02, 0.02]}})
    lo, hi = legacy.bounds(["trl:cpu"], np.zeros(1))
    assert (lo[0], hi[0]) == pytest.approx((-0.02, 0.02))  # TRL keeps its own key, never the device's


def test_held_out_scores_one_named_fold_and_refuses_an_unknown_one():
    """evaluate.held_out(fold=...) runs one fold of a split (one held-out hardware takes minutes where the whole
    evaluate takes half an hour); a fold the split does not have is one clear error naming the folds it has, before
    anything is fitted."""
    from perfpredict.core.errors import PerfPredictError
    from perfpredict.train.evaluate import held_out

    runs = pl.DataFrame({"g_name": ["a100-sxm-80gb", "h100-sxm-80gb", "a100-sxm-80gb"]})
    with pytest.raises(PerfPredictError, match=r"no fold 'b200'; its folds: a100-sxm-80gb, h100-sxm-80gb"):
        held_out(runs, pl.DataFrame(), split="hardware", fold="b200")
