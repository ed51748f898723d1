"""The OOM verdict (models.oom) and the memory outside the allocator it allows for (features.reserve)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from perfpredict.features.reserve import CUDA_CONTEXT_GIB, NCCL_COMMUNICATOR_GIB, NCCL_P2P_GIB, with_reserve
from perfpredict.models.oom import AT_RISK, FITS, NO_FIT, OomMargins, margin_cells, verdict


def _plans(**kw) -> pl.DataFrame:
    base = {"g_name": ["h100-sxm-80gb"], "g_memory_gib": [80.0], "p_framework": ["megatron"], "p_tp": [2],
            "p_dp": [8], "p_cp": [1], "p_ep": [1], "p_pp": [1]}
    return pl.DataFrame({**base, **kw})


def test_reserve_counts_context_one_buffer_set_per_communicator_and_what_cuda_hides():
    r = with_reserve(_plans()).row(0, named=True)
    # H100 80 GB: CUDA reports 79.19 GiB (features.generate.CUDA_VISIBLE_GIB); tp and dp: two communicators.
    assert r["r_hidden_gib"] == pytest.approx(80 - 79.19)
    assert r["r_nccl_gib"] == pytest.approx(2 * NCCL_COMMUNICATOR_GIB)
    assert r["r_usable_gib"] == pytest.approx(79.19 - CUDA_CONTEXT_GIB - 2 * NCCL_COMMUNICATOR_GIB)
    pp = with_reserve(_plans(p_tp=[1], p_dp=[1], p_pp=[4])).row(0, named=True)
    assert pp["r_nccl_gib"] == pytest.approx(NCCL_P2P_GIB)
    cpu = with_reserve(_plans(g_name=["cpu"], g_memory_gib=[64.0])).row(0, named=True)
    assert cpu["r_usable_gib"] == 64.0  # no device context, gloo


def test_cells_are_family_by_memory_class():
    df = pl.DataFrame({"p_framework": ["nanotron", "fsdp", "trl", "trl"], "g_memory_gib": [80.0, 24.0, 141.0, 64.0],
                       "g_name": ["h100-sxm-80gb", "rtx-4090", "h200-sxm-141gb", "cpu"]})
    assert margin_cells(df) == ["3d|64-96GiB", "zero|<=24GiB", "trl|>96GiB", "trl|host"]


def test_verdict_is_three_way_and_its_probability_agrees():
    pred = np.array([40.0, 70.0, 95.0])
    v = verdict(pred, pred * 0.9, pred * 1.2, np.full(3, 78.0), np.zeros(3), np.zeros(3))
    assert v["fit_verdict"].tolist() == [FITS, AT_RISK, NO_FIT]
    assert v["oom_risk"][0] <= 0.05 < v["oom_risk"][1] < 0.95 <= v["oom_risk"][2]
    # The stated margin is exact: a fitting plan's peak x (1 + margin) is within usable memory.
    assert pred[0] * (1 + v["oom_margin"][0]) <= 78.0 and v["fit_limit_gib"][0] == pytest.approx(78.0 / 1.2)


def test_margins_calibrated_per_cell_keep_false_oom_under_the_cap_and_leave_other_cells_alone():
    """Runs that fit peak at 0.5-0.97 of usable, failures at 0.9-1.5 (5 % of them crashes at 0.1, unreachable by
    any margin); intervals +-10 %. The cell's false OOM stays <= 2 %; missed OOM reaches its floor."""
    rng = np.random.default_rng(1)
    ran = np.r_[np.ones(500, bool), np.zeros(200, bool)]
    pred = np.r_[rng.uniform(0.5, 0.97, 500), rng.uniform(0.9, 1.5, 190), np.full(10, 0.1)]
    cells = ["3d|64-96GiB"] * 700
    m = OomMargins().fit(cells, pred / 1.1, pred * 1.1, np.ones(700), ran)
    got = m.cells_["3d|64-96GiB"]
    assert got["false_oom"] <= 0.02 and got["missed_oom"] <= 0.05 + 0.01
    a, b, cal = m.ab(["3d|64-96GiB", "zero|<=24GiB"])
    assert cal.tolist() == [True, False] and (a[1], b[1]) == (0.0, 0.0)
    v = verdict(pred, pred / 1.1, pred * 1.1, np.ones(700), np.full(700, a[0]), np.full(700, b[0]))
    assert np.mean(v["fit_verdict"][ran] == NO_FIT) <= 0.02
    assert OomMargins.from_dict(m.to_dict()).cells_ == m.cells_


def test_margin_never_tightens_the_interval_upper_end():
    """Wide intervals whose upper ends sit far above every failure would let a negative a keep missed OOM under
    5 % on the calibration rows; a stays at 0: the upper end is already the 95th percentile, and a tighter margin
    learned in one regime missed most failures of another (the playbook held out by scale)."""
    rng = np.random.default_rng(2)
    ran = np.r_[np.ones(300, bool), np.zeros(100, bool)]
    pred = np.r_[rng.uniform(0.2, 0.4, 300), rng.uniform(1.2, 2.0, 100)]
    m = OomMargins().fit(["3d|64-96GiB"] * 400, pred / 2, pred * 2, np.ones(400), ran)
    assert m.cells_["3d|64-96GiB"]["a"] == 0.0


def test_failures_of_unknown_cause_are_reported_apart_and_never_scored_as_oom():
    """The playbook's "crashed or out of memory, cause not given" rows (outcome failed_unknown) are neither OOM
    labels nor runs that fitted: oom_rows leaves them out and evaluate reports them in their own columns."""
    import polars as pl

    from perfpredict.train.data import failed_unknown_rows, oom_rows
    from perfpredict.train.evaluate import _failed_unknown

    df = pl.DataFrame({
        "outcome": ["ok", "oom", "failed_unknown", "failed_unknown", "failed_unknown", "failed_unknown"],
        "oom_evidence": [None, None, "siblings_over_gpu", "siblings_over_gpu", "larger_micro_batch_ran", None],
        "fit_verdict": ["fits", "does not fit", "fits", "at risk", "fits", "does not fit"],
        "pred_mem_gib": [10.0, 90.0, 20.0, 70.0, 30.0, 100.0], "r_usable_gib": [78.0] * 6})
    assert oom_rows(df)["outcome"].to_list() == ["ok", "oom"]
    assert failed_unknown_rows(df).height == 4
    got = _failed_unknown(df)
    assert got["failed_unknown_n"] == 4 and got["failed_unknown_fits"] == 0.5
    assert got["failed_unknown_under_half"] == 0.5  # 20 and 30 of 78 GiB usable
    assert got["failed_implied_oom_n"] == 2 and got["missed_oom_implied"] == 0.5
