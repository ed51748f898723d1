"""The trl probe family (collect probes --families trl), the per-host TRL scales read from it (models.trl_scales,
calibration.TrlCalibration) and the leave-one-host-out TRL split on the committed data."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from perfpredict.core.errors import PerfPredictError
from perfpredict.core.schema import TRL_OPS

TINY = dict(hidden=32, heads=4, kv_heads=2, head_dim=8, ffn=64, vocab=96, rows=2, seq=16)


def _probe_rows(configs=None):
    torch = pytest.importorskip("torch")
    from perfpredict.collect.probes import suite
    from perfpredict.collect.probes.trl_ops import trl_op_probes

    return trl_op_probes(quick=True, device=torch.device("cpu"), cap_s=0.01, timed=suite._timed, row=suite._row,
                         fail=suite._fail_row, configs=configs if configs is not None else [TINY])


def test_trl_probe_family_times_every_op_forward_and_backward():
    pytest.importorskip("trl")
    rows = _probe_rows()
    assert [(r["op"], r["pass_"]) for r in rows] == [(op, p) for op in TRL_OPS for p in ("fwd", "fwd_bwd")]
    assert all(r["outcome"] == "ok" and r["time_s"] > 0 and r["dtype"] == "fp32" for r in rows), rows
    linears = next(r for r in rows if r["op"] == "trl_linears")
    assert (linears["m"], linears["k"], linears["n"]) == (2 * 16, 32, 64)  # tokens, hidden, ffn
    head = next(r for r in rows if r["op"] == "trl_head" and r["pass_"] == "fwd_bwd")
    assert head["n"] == 96 and head["flops"] == 4 * 2.0 * head["m"] * 32 * 96


def test_masked_sdpa_matches_causal_gqa_where_nothing_is_padded():
    """The probe's repeat_kv + 4-D mask computes the same attention as SDPA's causal GQA on unpadded rows."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    from perfpredict.collect.probes.trl_ops import _padding_mask, _repeat_kv

    q, k, v = torch.randn(1, 4, 8, 8), torch.randn(1, 2, 8, 8), torch.randn(1, 2, 8, 8)
    mask = _padding_mask(1, 8, torch.device("cpu"))  # row 0 is never padded
    ours = F.scaled_dot_product_attention(q, _repeat_kv(k, 2), _repeat_kv(v, 2), attn_mask=mask)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.allclose(ours, ref, atol=1e-5)


def test_a_failing_trl_probe_is_a_row(monkeypatch):
    pytest.importorskip("torch")
    from perfpredict.collect.probes import trl_ops

    def no_trl(*a, **k):
        raise ImportError("No module named 'trl'")

    monkeypatch.setattr(trl_ops, "head_fn", no_trl)
    rows = _probe_rows()
    head = [r for r in rows if r["op"] == "trl_head"]
    assert len(head) == 2 and all(r["outcome"] == "error" and "trl" in r["error"] for r in head)
    assert all(r["outcome"] == "ok" for r in rows if r["op"] != "trl_head")


def test_run_probes_refuses_unknown_or_mixed_families(tmp_path):
    pytest.importorskip("torch")
    from perfpredict.collect.probes.suite import run_probes

    with pytest.raises(PerfPredictError, match="unknown probe families"):
        run_probes(families=("gemm", "flash"), out_dir=tmp_path)
    with pytest.raises(PerfPredictError, match="runs alone"):
        run_probes(families=("trl", "gemm"), out_dir=tmp_path)


def test_trl_family_writes_its_own_file(tmp_path, monkeypatch):
    pytest.importorskip("trl")
    from perfpredict.collect.probes import trl_ops
    from perfpredict.collect.probes.suite import run_probes

    monkeypatch.setattr(trl_ops, "trl_op_configs", lambda quick: [TINY])
    path, df = run_probes(families=("trl",), quick=True, out_dir=tmp_path, command="test")
    assert path.name == "probes-trl.parquet" and df.height == 8
    assert set(df["op"]) == set(TRL_OPS) and (df["command"] == "test").all() and df["hardware_fingerprint"].is_not_null().all()
    assert not (tmp_path / "probes.parquet").exists()


# --- scales from probes ------------------------------------------------------------------------------------------
class _Unit:
    """A kernel model that says 1 s for every kernel: a probe's ratio is then its time over its query count."""

    def predict(self, q: pl.DataFrame) -> np.ndarray:
        return np.ones(q.height)


def _trl_probe_frame(hardware: str, t: float, ops=TRL_OPS) -> pl.DataFrame:
    rows = []
    for op in ops:
        for p in ("fwd", "fwd_bwd"):
            rows.append(dict(op=op, pass_=p, dtype="fp32", m=64, k=32, n=96 if op == "trl_head" else 64, batch=2,
                             heads=4, kv_heads=2, seq_len=32, head_dim=8, time_s=t, outcome="ok", hardware=hardware))
    return pl.DataFrame(rows)


def test_probe_scales_are_measured_over_generic_time_for_cpu_hosts_only():
    from perfpredict.features.trl import CPU_FOLD_NOGRAD_CE, CPU_FOLD_POLICY_CE
    from perfpredict.models.trl_scales import flat_scales, trl_probe_scales

    probes = pl.concat([_trl_probe_frame("cpu-epyc-avx512", 3.0), _trl_probe_frame("h100-sxm-80gb", 3.0),
                        _trl_probe_frame("cpu", 3.0, ops=TRL_OPS[:2])])
    scales = trl_probe_scales(probes, _Unit())
    assert set(scales) == {"cpu-epyc-avx512"}  # the GPU is never calibrated from CPU probes; `cpu` lacks two ops
    s = scales["cpu-epyc-avx512"]
    # Queries per probe (unit seconds each): attention 1 per pass; the layer's 4 GEMMs (x3 passes with backward);
    # elementwise 2 rmsnorm + swiglu + 2 adds (x3 with backward).
    assert s["attention_scale"] == pytest.approx(6.0 / 2.0)
    assert s["gemm_scale"] == pytest.approx(6.0 / (4 + 12))
    assert s["membound_scale"] == pytest.approx(6.0 / (5 + 15))
    # fold: (head time - gemm_scale x its tile GEMMs) / its fold units.
    assert s["fold_scale"] == pytest.approx((6.0 - s["gemm_scale"] * (1 + 4)) / (CPU_FOLD_NOGRAD_CE + CPU_FOLD_POLICY_CE))
    assert flat_scales(scales)["gemm_scale@cpu-epyc-avx512"] == s["gemm_scale"]


def test_composition_reads_a_hosts_own_scale_and_leaves_others_alone():
    """A "<scale>@<hardware>" key moves that host's TRL rows only: not another CPU host's, not a GPU's."""
    from perfpredict.core.catalog import get_gpu
    from perfpredict.core.hardware import Cluster
    from perfpredict.models.compose import TRL_CALIBRATION, compose
    from perfpredict.predictor.predict import load_predictor
    from tests.test_trl import _describe, _row

    b = load_predictor()
    d = _describe([_row("dpo", "live", cluster=Cluster(gpu=get_gpu("cpu-epyc-avx512"), gpus_per_node=1, nodes=1)),
                   _row("dpo", "live", cluster=Cluster(gpu=get_gpu("cpu-epyc-avx2"), gpus_per_node=1, nodes=1)),
                   _row("dpo", "live", cluster=Cluster(gpu=get_gpu("h100-sxm-80gb"), gpus_per_node=1, nodes=1),
                        precision="bf16")])
    cal = {**TRL_CALIBRATION, **(b.trl_calibration or {})}

    def step(extra):
        return compose(d, b.kernels, launch_floor=b.launch_floor_s, trl_calibration={**cal, **extra},
                       canonical=False)

    base = step({})
    out = step({"attention_scale@cpu-epyc-avx512": cal["attention_scale"] * 3.0,
                "attention_scale@h100-sxm-80gb": 5.0})
    moved, b0 = out["k_step_s"].to_numpy(), base["k_step_s"].to_numpy()
    assert moved[0] == pytest.approx(b0[0] + 2.0 * cal["attention_scale"] * out["k_attention_s"][0])
    assert moved[1] == b0[1] and moved[2] == b0[2]


def test_bundle_check_accepts_per_host_scales_only():
    from perfpredict.models.bundle import check_trl_calibration

    assert check_trl_calibration({"gemm_scale@cpu-epyc-avx512": 0.7}, "t") == {"gemm_scale@cpu-epyc-avx512": 0.7}
    for bad in ({"zero3_hook_s@cpu": 0.1}, {"gemm@cpu": 1.0}, {"gemm_scale@cpu": -1.0}):
        with pytest.raises(PerfPredictError, match="trl_calibration"):
            check_trl_calibration(bad, "t")


# --- the calibration and the leave-one-host-out split on the committed data --------------------------------------
@pytest.fixture(scope="module")
def committed():
    from perfpredict.models.kernels import KernelModel
    from perfpredict.train.data import load_probes, load_runs, time_rows

    runs = load_runs("datasets").filter(pl.col("source").is_in(["ours-cpu", "ours-cpu-trl"]))
    probes = load_probes("datasets").filter(pl.col("hardware").str.starts_with("cpu"))
    return time_rows(runs), probes, KernelModel(seed=0).fit(probes)


def test_trl_op_probes_committed_and_kept_out_of_the_kernel_models(committed):
    _, probes, kernels = committed
    trl = probes.filter(pl.col("op").is_in(list(TRL_OPS)))
    assert set(trl["hardware"]) == {"cpu-epyc-avx512"} and trl.height >= 100
    generic_ok = probes.filter(~pl.col("op").is_in(list(TRL_OPS)) & (pl.col("outcome").fill_null("ok") == "ok")
                               & (pl.col("time_s") > 0))
    assert sum(f["rows"] for k, f in kernels.families_.items() if k.endswith(".cpu")) == generic_ok.height


def test_calibration_reads_probe_ratios_times_a_shared_residual(committed):
    """With two probed hosts' TRL steps, each host's scales are its probe ratios x residuals fitted on both; with
    one, the constants apply and the estimator says why."""
    from perfpredict.models.calibration import TrlCalibration
    from perfpredict.models.trl_scales import trl_probe_scales

    tr, probes, kernels = committed
    y = tr["step_time_s"].to_numpy()
    scales = trl_probe_scales(probes, kernels)
    assert set(scales) == {"cpu-epyc-avx512"}
    one = TrlCalibration(kernels, probe_scales=scales).fit(tr, y)
    plain = TrlCalibration(kernels).fit(tr, y)
    assert "1 host(s)" in one.probe_fallback_ and one.calibration_ == plain.calibration_
    # A second probed host (the AVX2 EPYC, given ratios 1.5x the AVX-512's): both read their ratios x residuals.
    two = {**scales, "cpu-epyc-avx2": {k: v * 1.5 for k, v in scales["cpu-epyc-avx512"].items()}}
    est = TrlCalibration(kernels, probe_scales=two).fit(tr, y)
    assert est.probe_fallback_ is None and est.measured_hosts_ == ["cpu-epyc-avx2", "cpu-epyc-avx512"]
    for k, r in est.residuals_.items():
        assert est.calibration_[f"{k}@cpu-epyc-avx512"] == pytest.approx(
            float(np.clip(scales["cpu-epyc-avx512"][k] * r, 0.25, 8.0)))
        assert est.calibration_[f"{k}@cpu-epyc-avx2"] == pytest.approx(
            float(np.clip(two["cpu-epyc-avx2"][k] * r, 0.25, 8.0)))
    pred = est.predict(tr)
    assert np.isfinite(pred).all() and (pred > 0).all()


def test_trl_host_split_holds_out_each_hosts_trl_rows():
    from perfpredict.features.trl import is_trl
    from perfpredict.train.data import load_runs
    from perfpredict.train.evaluate import SPLITS, folds

    assert "trl-host" in SPLITS
    runs = load_runs("datasets").filter(pl.col("source").is_in(["ours-cpu", "ours-cpu-trl"]))
    got = dict(folds(runs, "trl-host"))
    assert set(got) == {"cpu-epyc-avx2", "cpu-epyc-avx512"}
    trl = runs.select(is_trl()).to_series().to_numpy()
    for host, mask in got.items():
        assert mask.sum() > 0 and (trl[mask]).all() and (runs["g_name"].to_numpy()[mask] == host).all()
    assert not (got["cpu-epyc-avx2"] & got["cpu-epyc-avx512"]).any()
    assert list(folds(runs.filter(pl.col("g_name") != "cpu-epyc-avx2"), "trl-host")) == []  # one host: no fold


def test_trl_host_baselines_meet_the_targets():
    """Leave-one-host-out on the committed TRL rows: step time <= 20 %, memory <= 5 %, both directions (issue 19);
    the AVX-512 host's probe ratios alone are reported, the AVX2 host (no TRL-op probes) falls back."""
    from perfpredict.train.evaluate import trl_host_baselines

    t = {r["held_out"]: r for r in trl_host_baselines(data="datasets").to_dicts()}
    assert set(t) == {"cpu-epyc-avx2", "cpu-epyc-avx512"}
    for r in t.values():
        assert r["time_probes_mape"] <= 0.20 and r["mem_analytic_mape"] <= 0.05, r
        assert r["time_probes_mape"] <= r["time_composed_mape"], r
    assert np.isnan(t["cpu-epyc-avx2"]["time_probe_ratios_mape"]) and t["cpu-epyc-avx2"]["trl_op_probes"] == 0
    assert t["cpu-epyc-avx512"]["trl_op_probes"] >= 100 and np.isfinite(t["cpu-epyc-avx512"]["time_probe_ratios_mape"])


def test_train_summary_says_where_trl_scales_come_from():
    from perfpredict.train.api import _trl_scales_line

    assert "TRL-op probes on cpu-epyc-avx512" in _trl_scales_line({"trl_probe_hosts": ["cpu-epyc-avx512"]})
    assert "fitted constants (TRL steps of 1 host(s)" in _trl_scales_line(
        {"trl_probe_hosts": [], "trl_probe_fallback": "TRL steps of 1 host(s) with TRL-op probes in training"})
    assert _trl_scales_line({}) == ""  # a bundle saved before TRL-op probes
