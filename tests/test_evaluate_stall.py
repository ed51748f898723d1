"""Held-out scoring of the stall regime (train.evaluate): the nodes split, P(stall) against measured stalls, and the
ranking's order and share of groups within 5 % of the best."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from perfpredict.train.evaluate import SPLITS, _ranking, _stall_calibration, folds


def test_nodes_split_leaves_one_multi_node_count_out_per_source():
    runs = pl.DataFrame({"source": ["a"] * 6 + ["b"] * 3, "c_nodes": [1, 2, 2, 4, 8, 8, 1, 1, 2]})
    got = dict(folds(runs, "nodes"))
    assert list(got) == ["a:nodes-2", "a:nodes-4", "a:nodes-8", "b:nodes-2"]  # never a single node
    np.testing.assert_array_equal(got["a:nodes-8"], [0, 0, 0, 0, 1, 1, 0, 0, 0])
    np.testing.assert_array_equal(got["b:nodes-2"], [0, 0, 0, 0, 0, 0, 0, 0, 1])
    assert "nodes" in SPLITS


def test_stall_calibration_scores_the_rows_a_stall_model_scored():
    tr = pl.DataFrame({"pred_stall_p": [0.0, 0.5, 0.5, 0.25, 0.25], "stalled": [True, True, False, False, False]})
    m = _stall_calibration(tr)
    assert m["stall_n"] == 4  # P = 0: out of the stall model's scope
    assert m["stall_p_mean"] == pytest.approx(0.375) and m["stall_rate"] == pytest.approx(0.25)
    assert m["stall_brier"] == pytest.approx((0.25 + 0.25 + 0.0625 * 2) / 4)
    assert m["stall_logloss"] == pytest.approx(-(np.log(0.5) * 2 + np.log(0.75) * 2) / 4)
    assert np.isnan(_stall_calibration(tr.drop("stalled"))["stall_p_mean"])


def test_ranking_orders_by_expected_throughput_and_counts_groups_within_five_percent():
    # group g1: the plan with the shortest expected step is not the one with the most expected throughput
    df = pl.DataFrame({
        "cluster_group": ["g1"] * 3 + ["g2"] * 3,
        "step_time_s": [1.0, 1.5, 2.0, 1.0, 1.02, 3.0],
        "pred_time_s": [1.0, 1.5, 2.0, 1.1, 1.0, 3.0],
        "pred_expected_time_s": [7.0, 1.5, 2.0, 1.1, 1.0, 3.0],
        "pred_expected_steps_per_s": [0.71, 1 / 1.5, 0.5, 1 / 1.1, 1.0, 1 / 3.0],
    })
    r = _ranking(df)
    assert r["rank_groups"] == 2
    assert r["rank_top1_regret"] == pytest.approx((0.0 + (1 - 1 / 1.02)) / 2)
    assert r["rank_within_5pct"] == 1.0
    older = _ranking(df.drop("pred_expected_steps_per_s"))  # predictions without it: the point's order
    assert older["rank_top1_regret"] == pytest.approx((0.0 + (1 - 1 / 1.02)) / 2)
