"""Online-DPO iterations (predictor.generate.iteration): colocated vs split, the weight hand-over, ties, the CLI."""

from __future__ import annotations

import json

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from perfpredict.cli import app
from perfpredict.core.catalog import get_gpu, get_model
from perfpredict.core.errors import PerfPredictError
from perfpredict.core.generate import GenWorkload
from perfpredict.core.hardware import Cluster
from perfpredict.predictor.generate.iteration import MODES, rank_iteration, weight_sync
from perfpredict.predictor.ties import comparison, tied_top

runner = CliRunner()
SMALL = dict(model="llama-3.2-1b", gpu="h100-sxm-80gb")
W = GenWorkload(prompts=512, samples_per_prompt=2, input_len=256, output_len=256)


@pytest.fixture(scope="module")
def ranking():
    return rank_iteration(model=get_model("llama-3.2-1b"), cluster=Cluster(get_gpu("h100-sxm-80gb"), 4, 1),
                          workload=W)


def test_every_mode_is_ranked_and_colocated_never_idles(ranking):
    t = ranking.table
    assert set(t["mode"]) == set(MODES)
    assert t["iteration_s"].is_sorted()
    co = t.filter(pl.col("mode") == "colocated")
    assert (co["gen_devices"] == 4).all() and (co["train_devices"] == 4).all()
    assert (co["idle_gpu_share"] == 0).all()
    split = t.filter(pl.col("mode") == "split")
    assert ((split["gen_devices"] + split["train_devices"]) == 4).all()
    assert (split["idle_gpu_share"] > 0).all()  # one side waits while the other works


def test_split_async_overlaps_the_two_sides(ranking):
    t = ranking.table
    for g in t.filter(pl.col("mode") == "split")["gen_devices"]:
        a = t.filter((pl.col("mode") == "split-async") & (pl.col("gen_devices") == g)).row(0, named=True)
        s = t.filter((pl.col("mode") == "split") & (pl.col("gen_devices") == g)).row(0, named=True)
        assert a["iteration_s"] == pytest.approx(max(a["generate_s"], a["train_s"]) + a["sync_s"])
        assert a["iteration_s"] < s["iteration_s"] == pytest.approx(s["generate_s"] + s["sync_s"] + s["train_s"])


def test_memory_hand_over(ranking):
    """Sleep off: the engine keeps its utilisation through training, so the trainer's budget shrinks with it;
    sleep on: the trainer gets the device back but for the CUDA-graph pool, and level 1 pays two PCIe copies."""
    t = ranking.table.filter(pl.col("mode") == "colocated")
    off = t.filter(pl.col("sleep_level") == 0).sort("gen_memory_utilization")
    assert off["trainer_budget_gib"].is_sorted(descending=True) and off.height >= 2
    on = t.filter(pl.col("sleep_level") > 0)
    assert (on["trainer_budget_gib"] > off["trainer_budget_gib"].max()).all()
    assert (t.filter(pl.col("sleep_level") == 1)["sync_sleep_s"] > 0).all()
    assert (t.filter(pl.col("sleep_level") != 1)["sync_sleep_s"] == 0).all()
    # The KV cache follows the engine's utilisation.
    kv = t.filter(pl.col("sleep_level") == 2).sort("gen_memory_utilization")["kv_capacity_tokens"]
    assert kv.is_sorted()


@settings(max_examples=30, deadline=None, derandomize=True)
@given(st.sampled_from(["llama-3.2-1b", "llama-3.1-8b", "llama-3.1-70b"]), st.sampled_from(["colocated", "split"]),
       st.sampled_from([1, 2]), st.booleans(), st.integers(2, 16))
def test_property_weight_sync_grows_with_the_model_and_falls_with_bandwidth(name, mode, sleep, shards, train_gpus):
    m, gpu = get_model(name), get_gpu("h100-sxm-80gb")
    kw = dict(train_gpus=train_gpus, trainer_shards=shards, gen_tp=1, mode=mode,
              sleep_level=sleep if mode == "colocated" else 0)
    cl = Cluster(gpu, 8, 2)
    base = weight_sync(m, cl, **kw).total_s
    bigger = weight_sync(get_model("llama-3.1-405b"), cl, **kw).total_s
    assert bigger > base
    from dataclasses import replace
    fast = replace(gpu, intra_node_bw_gb_per_s=gpu.intra_node_bw_gb_per_s * 4,
                   inter_node_bw_gb_per_s=gpu.inter_node_bw_gb_per_s * 4, hbm_tb_per_s=gpu.hbm_tb_per_s * 4,
                   pcie_gb_per_s=gpu.pcie_gb_per_s * 4)
    assert weight_sync(m, Cluster(fast, 8, 2), **kw).total_s <= base
    if mode == "split":
        assert weight_sync(m, cl, **kw).transfer_s > 0
    else:
        assert weight_sync(m, cl, **kw).transfer_s == 0


def test_seq_len_is_the_trainers():
    short = rank_iteration(model=get_model("llama-3.2-1b"), cluster=Cluster(get_gpu("h100-sxm-80gb"), 2, 1),
                           workload=W, modes=("colocated",))
    long = rank_iteration(model=get_model("llama-3.2-1b"), cluster=Cluster(get_gpu("h100-sxm-80gb"), 2, 1),
                          workload=W, modes=("colocated",), seq_len=4096)
    assert long.seq_len == 4096 and short.seq_len == 512
    assert long.table["train_s"].min() > short.table["train_s"].min()
    assert long.table["generate_s"].min() == pytest.approx(short.table["generate_s"].min())


def test_bad_iteration_inputs_are_one_line_errors():
    cl = Cluster(get_gpu("h100-sxm-80gb"), 2, 1)
    with pytest.raises(PerfPredictError, match="mode"):
        rank_iteration(model=get_model("llama-3.2-1b"), cluster=cl, workload=W, modes=("pipelined",))
    with pytest.raises(PerfPredictError, match="sleep level"):
        weight_sync(get_model("llama-3.2-1b"), cl, train_gpus=2, trainer_shards=True, gen_tp=1, mode="colocated",
                    sleep_level=3)


# --- ties ---------------------------------------------------------------------------------------------------------
def _cands(rows):
    return pl.DataFrame(rows, schema=["label", "v", "lo", "hi", "tp"], orient="row")


def test_overlapping_intervals_are_a_tie_and_name_what_differs():
    t = tied_top(_cands([("a", 100, 60, 170, 1), ("b", 70, 40, 120, 2), ("c", 30, 20, 50, 4)]), value="v",
                 lo="lo", hi="hi", label="label", knobs=("tp",))
    assert t.tied == ("a", "b") and not t.separated and t.is_tie
    assert t.differ == {"tp": [1, 2]}
    assert t.margin == pytest.approx(100 / 70 - 1)
    assert "tied" in t.sentence() and "tp 1/2" in t.sentence()
    assert "tied within" in comparison(t, "b", 43) and comparison(t, "c", 233) == "+233% for #1"


def test_separated_intervals_print_a_winner():
    t = tied_top(_cands([("a", 100, 90, 110, 1), ("b", 50, 45, 55, 2)]), value="v", lo="lo", hi="hi", label="label")
    assert t.separated and not t.is_tie and "is best: 100 %" in t.sentence()


def test_lower_is_better_and_list_bounds():
    df = pl.DataFrame({"label": ["x", "y", "z"], "t": [10.0, 12.0, 30.0], "b": [[8.0, 13.0], [11.0, 14.0], [25, 40]]})
    t = tied_top(df, value="t", lo="b", label="label", higher_is_better=False)
    assert t.best == "x" and t.tied == ("x", "y") and t.runner_up == "y"
    with pytest.raises(PerfPredictError, match="no column"):
        tied_top(df, value="nope", lo="b", label="label")


# --- CLI ----------------------------------------------------------------------------------------------------------
def _cli(*extra):
    return runner.invoke(app, ["iteration", "--model", SMALL["model"], "--gpu", SMALL["gpu"], "--gpus", "4",
                               "--prompts", "512", "--samples-per-prompt", "2", "--input-len", "256",
                               "--output-len", "256", *extra])


def test_iteration_cli_table_explain_and_ties():
    r = _cli("--explain", "--top", "4")
    assert r.exit_code == 0, r.output
    assert "online DPO on 4 x h100-sxm-80gb" in r.output and "seq_len 512" in r.output
    assert "#1 " in r.output and ("memory hand-over" in r.output or "idles" in r.output)
    assert "tied" in r.output or "is best" in r.output


def test_iteration_cli_modes_seq_len_json():
    r = _cli("--mode", "split", "--seq-len", "2048", "--json", "-")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    assert rows and {x["mode"] for x in rows} == {"split"}
    assert all(x["gen_devices"] + x["train_devices"] == 4 for x in rows)
    assert rows[0]["iteration_s"] == min(x["iteration_s"] for x in rows)
    bad = _cli("--mode", "pipelined")
    assert bad.exit_code == 2 and "unknown iteration mode" in bad.output and "Traceback" not in bad.output


def test_generate_rank_says_tied_or_names_a_separated_winner():
    r = runner.invoke(app, ["generate", "rank", "--model", "llama-3.2-1b", "--gpu", "h100-sxm-80gb", "--gpus", "4",
                            "--prompts", "256", "--input-len", "128", "--output-len", "128"])
    assert r.exit_code == 0, r.output
    assert "tied: " in r.output or " is best: " in r.output
    e = runner.invoke(app, ["generate", "rank", "--model", "llama-3.2-1b", "--gpu", "h100-sxm-80gb", "--gpus", "4",
                            "--prompts", "256", "--input-len", "128", "--output-len", "128", "--explain"])
    assert e.exit_code == 0 and ("tied: " in e.output or " is best: " in e.output)
