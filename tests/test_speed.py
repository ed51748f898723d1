"""The fast ranking path gives the numbers of the plain one (issue 21's speed work must not change a prediction).

Each shortcut is checked against what it replaced, run in the same test: numpy trees against xgboost's predict,
numpy neighbours against scipy's cKDTree, the deduplicated composition against composing every row, the plan-column
frame against Plan objects, and a whole ranking through all of them against a ranking through none. Speed targets
live in benchmarks/rank_speed.py (no timed assertions here)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

import perfpredict.models.compose as compose_mod
import perfpredict.models.plan_model as plan_model
import perfpredict.predictor.rank as rank_mod
from perfpredict.core import Cluster, Workload, get_gpu, get_model
from perfpredict.features.frame import plans_frame
from perfpredict.features.plans import PlanSpace, Rejections, enumerate_plans, plan_columns_frame
from perfpredict.models.gb import GBRegressor
from perfpredict.models.neighbours import Neighbours
from perfpredict.predictor.predict import load_predictor, predict_frame
from perfpredict.predictor.rank import rank_plans

c = pl.col
H100, A100, CPU = get_gpu("h100-sxm-80gb"), get_gpu("a100-sxm-80gb"), get_gpu("cpu")
SCENARIOS = {  # small enough for a test, together covering Megatron/DeepSpeed/FSDP/nanotron/TRL, MoE, CPU, cp, pp
    "8b-16xh100": (get_model("llama-3.1-8b"), Cluster(H100, 8, 2), Workload(objective="dpo", seq_len=2048,
                                                                              global_batch=64), PlanSpace()),
    "mixtral-8xa100": (get_model("mixtral-8x7b"), Cluster(A100, 8, 1), Workload(objective="sft", seq_len=4096,
                                                                                 global_batch=32), PlanSpace()),
    "0.5b-cpu-trl": (get_model("qwen2.5-0.5b"), Cluster(CPU, 1, 1), Workload(objective="dpo", seq_len=512,
                                                                               global_batch=8),
                     PlanSpace(frameworks=("trl", "fsdp", "deepspeed"))),
    "3b-128xh100-pp": (get_model("llama-3.2-3b"), Cluster(H100, 8, 16), Workload(objective="dpo", seq_len=4096,
                                                                                  global_batch=256),
                       PlanSpace(frameworks=("nanotron", "megatron"), micro_batches=(1, 4))),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_plan_columns_frame_is_enumerate_plans_as_columns(name):
    model, cluster, workload, space = SCENARIOS[name]
    rej_a, rej_b = Rejections(), Rejections()
    slow = plans_frame(model, cluster, workload, list(enumerate_plans(model, cluster, workload, space, rej_a)))
    fast = plans_frame(model, cluster, workload, plan_columns_frame(model, cluster, workload, space, rej_b))
    assert_frame_equal(fast, slow)
    assert rej_a.counts == rej_b.counts


def test_plan_columns_frame_without_plans_has_the_schema():
    args = (get_model("llama-3.2-1b"), Cluster(H100, 8, 1), Workload(global_batch=64))
    empty = plan_columns_frame(*args, PlanSpace(micro_batches=(7,)))  # 7 divides no per-replica batch
    assert empty.height == 0 and empty.columns == plan_columns_frame(*args).columns
    frame = plans_frame(*args, empty)
    assert frame.height == 0 and "p_stage_layers" in frame.columns


def test_neighbours_match_scipy():
    from scipy.spatial import cKDTree

    rng = np.random.default_rng(0)
    data = rng.normal(size=(700, 31))
    data[100:150] = data[:50]  # exact duplicates, as training sets have
    data[200:260, :10] = 0.0
    query = np.vstack([rng.normal(size=(400, 31)), data[:60], data[:5] + 1e-9])
    ours, ref = Neighbours(data), cKDTree(data)
    for k in (1, 5, 6):
        d, _ = ours.query(query, k=k)
        d_ref, _ = ref.query(query, k=k)
        np.testing.assert_allclose(d, d_ref, rtol=1e-12, atol=1e-12)
    far = ours.outside(query + 50.0, 10.0)
    assert far.all() and (ref.query(query + 50.0, k=1)[0] >= 10.0).all()
    assert not ours.outside(data[:20], 1e-6).any()


def _reference_path(monkeypatch):
    """Every shortcut swapped back for what it replaced: xgboost's predict, scipy's k-d tree, a composition of
    every row, Plan objects and layouts probed anew, corrections predicted on every row, the stall mixture's
    bounds bisected on every row."""
    from scipy.spatial import cKDTree

    from perfpredict.models.gb import xgboost_module

    def booster_predict(self, X):
        if getattr(self, "booster_", None) is None:
            self.booster_ = xgboost_module().Booster(model_file=str(self.path_))
        return self.booster_.inplace_predict(np.asarray(X, dtype=np.float32))

    monkeypatch.setattr(GBRegressor, "predict", booster_predict)
    monkeypatch.setattr(rank_mod, "SCENARIO_MEMO_SIZE", 0)  # no scenario remembered: enumerated and described anew
    monkeypatch.setattr(plan_model, "Neighbours", cKDTree)
    monkeypatch.setattr(compose_mod, "distinct_rows", lambda df, keys=None: (df, np.arange(df.height)))
    monkeypatch.setattr(rank_mod, "plan_columns_frame", lambda *a: plans_frame(*a[:3], list(enumerate_plans(*a)))
                        .select(pl.col("^p_.*$")))
    import perfpredict.features.plans as plans_mod
    import perfpredict.models.bundle as bundle_mod
    from perfpredict.models.stall import _mixture_bounds_reference

    monkeypatch.setattr(bundle_mod, "mixture_bounds", _mixture_bounds_reference)
    monkeypatch.setattr(plans_mod, "_PROBES", {})
    monkeypatch.setattr(plans_mod, "LAYOUT_PROBE_MEMO", 0)  # every layout probed anew
    real = plan_model.Correction.predict_log_ratio
    monkeypatch.setattr(plan_model.Correction, "predict_log_ratio", lambda self, df, where=None: real(self, df))
    monkeypatch.setattr(plan_model.Correction, "distance",
                        lambda self, df, beyond=None: _kdtree_distance(self, df))


def _kdtree_distance(self, df):
    Z = self._domain_Z(self._X(df))  # the standardised features the weight reads (no physics knobs)
    keys = np.array(self.domain_keys(df), dtype=object)
    out = np.full(len(Z), np.inf)
    for key, tree in self._trees_of().items():
        idx = keys == key
        if idx.any():
            d, _ = tree.query(Z[idx], k=min(plan_model.K_NEIGHBOURS, tree.n))
            out[idx] = d.reshape(int(idx.sum()), -1).mean(axis=1) / self.radius_[key]
    return out


def _fresh_bundle():
    from perfpredict.models.bundle import Bundle, default_path

    return Bundle.load(default_path())  # not the cached one: its neighbour structures are built per path


def _assert_rankings_equal(fast: pl.DataFrame, slow: pl.DataFrame) -> None:
    assert fast.columns == slow.columns and fast.height == slow.height
    for col in fast.columns:
        a, b = fast[col], slow[col]
        if a.dtype.is_float():
            np.testing.assert_allclose(a.to_numpy(), b.to_numpy(), rtol=1e-9, atol=0.0, err_msg=col)
        elif col not in ("rank", "plan") and not col.startswith("p_"):
            assert a.to_list() == b.to_list(), col
    # The order may only differ between plans whose predictions tie to within 1e-9.
    assert sorted(fast["plan"].to_list()) == sorted(slow["plan"].to_list())


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_ranking_equals_the_reference_path(name, monkeypatch):
    model, cluster, workload, space = SCENARIOS[name]
    fast = rank_plans(model=model, cluster=cluster, workload=workload, space=space, bundle=_fresh_bundle())
    with monkeypatch.context() as m:
        _reference_path(m)
        slow = rank_plans(model=model, cluster=cluster, workload=workload, space=space, bundle=_fresh_bundle())
    _assert_rankings_equal(fast.table.sort("plan"), slow.table.sort("plan"))
    assert fast.table["plan"].head(10).to_list() == slow.table["plan"].head(10).to_list()


def test_dedup_composition_equals_composing_every_row(monkeypatch):
    model, cluster, workload, space = SCENARIOS["8b-16xh100"]
    flat = plans_frame(model, cluster, workload, plan_columns_frame(model, cluster, workload, space))
    b = load_predictor()
    fast = predict_frame(flat, bundle=b)
    monkeypatch.setattr(compose_mod, "distinct_rows", lambda df, keys=None: (df, np.arange(df.height)))
    slow = predict_frame(flat, bundle=b)
    for col in [k for k in fast.columns if k.startswith(("k_", "kc_")) or k == "step_time_s"]:
        np.testing.assert_allclose(fast[col].to_numpy(), slow[col].to_numpy(), rtol=1e-12, atol=1e-300,
                                   err_msg=col)


def test_rank_path_imports_nothing_heavy():
    """A cold `perfpredict rank` imports no xgboost, scipy, torch, matplotlib or scikit-learn."""
    code = ("import sys, runpy, atexit\n"
            "heavy = {'xgboost', 'scipy', 'torch', 'matplotlib', 'sklearn'}\n"
            "atexit.register(lambda: print('HEAVY', sorted({m.split('.')[0] for m in sys.modules} & heavy)))\n"
            "sys.argv = ['perfpredict', 'rank', '--model', 'llama-3.1-8b', '--gpu', 'h100-sxm-80gb', '--gpus', '16',"
            " '--top', '3']\n"
            "runpy.run_module('perfpredict.cli', run_name='__main__')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "top 3 plans" in p.stdout, p.stdout + p.stderr
    assert "HEAVY []" in p.stdout, p.stdout


def test_shortcuts_of_the_second_pass_give_the_first_pass_numbers():
    """Kernel predictions remembered per query, the OOM cells and erfc per distinct value, and models read at their
    first prediction: each equals what it replaced."""
    import math

    from perfpredict.core.frameworks import FAMILY
    from perfpredict.features.compute import on_cpu
    from perfpredict.features.descriptors import describe
    from perfpredict.models.compose import kernel_queries
    from perfpredict.models.oom import _erfc, margin_cells, memory_class

    model, cluster, workload, space = SCENARIOS["mixtral-8xa100"]
    flat = plans_frame(model, cluster, workload, plan_columns_frame(model, cluster, workload, space)).head(50)
    q = kernel_queries(describe(flat))
    keys = q.select(*compose_mod.KERNEL_KEYS, "family").unique(maintain_order=True)
    kernels = _fresh_bundle().kernels  # its models not read yet: read at the first prediction
    first = kernels.predict_remembered(keys)
    np.testing.assert_array_equal(first, kernels.predict(keys))
    np.testing.assert_array_equal(kernels.predict_remembered(keys.reverse()), first[::-1])
    cells = pl.DataFrame({"p_framework": ["megatron", "trl", "deepspeed", "trl", "fsdp", "megatron"],
                          "g_memory_gib": [80.0, 0.0, 24.0, 0.0, 141.0, 80.0],
                          "g_name": ["h100-sxm-80gb", "cpu", "rtx-4090", "cpu", "h200-sxm-141gb", "h100-sxm-80gb"]})
    cpu = cells.select(on_cpu()).to_series().to_list()
    assert margin_cells(cells) == [f"{FAMILY.get(f, f)}|{memory_class(g, x)}" for f, g, x in
                                   zip(cells["p_framework"], cells["g_memory_gib"], cpu, strict=True)]
    z = np.array([0.3, -1.2, 0.3, 5.0, np.inf, -np.inf, 0.0])
    np.testing.assert_array_equal(_erfc(z), [math.erfc(v) for v in z])


def test_kernel_part_sums_equal_a_group_by_over_every_query():
    """_kernel_parts' per-row sums (one bincount over (row, part) cells) equal summing each plan's own queries."""
    from perfpredict.features.descriptors import describe
    from perfpredict.models.compose import PARTS, TRL_FAMILIES, _kernel_parts, kernel_queries

    model, cluster, workload, space = SCENARIOS["mixtral-8xa100"]
    desc = describe(plans_frame(model, cluster, workload, plan_columns_frame(model, cluster, workload, space)))
    kernels = _fresh_bundle().kernels
    fast = _kernel_parts(desc, kernels)
    q = kernel_queries(desc)
    q = q.with_columns(kt=pl.Series(kernels.predict(q.select(*compose_mod.KERNEL_KEYS, "family"))),
                       **{k: c(k).fill_null(0.0) for k in ("rc", "rf", "eg") if k in q.columns})
    timed, work = c("part") == "compute", c("kt") * c("count")
    sums = q.group_by("row").agg(
        *[work.filter(c("part") == p).sum().alias(f"k_{p}_raw_s") for p in (*PARTS, "dpgather", "trlfold")],
        *[work.filter(timed & (c("family") == f)).sum().alias(f"k_{f}_s") for f in TRL_FAMILIES],
        n_timed=(c("count") - c("eg")).filter(timed).sum(), k_recompute_s=(c("kt") * c("rc")).filter(timed).sum(),
    ).sort("row")
    assert sums.height == desc.height
    for col in sums.columns[1:]:
        np.testing.assert_allclose(fast[col].to_numpy(), sums[col].to_numpy(), rtol=1e-12, atol=1e-300, err_msg=col)


def test_a_remembered_scenario_ranks_as_a_fresh_one(monkeypatch):
    """The scenario memo (rank._described_plans) gives the ranking and the rejection counts of enumerating and
    describing anew; it holds at most SCENARIO_MEMO_SIZE scenarios."""
    model, cluster, workload, space = SCENARIOS["8b-16xh100"]
    args = dict(model=model, cluster=cluster, workload=workload, space=space, bundle=load_predictor())
    rank_mod._scenario_memo.clear()
    first = rank_plans(**args)
    again = rank_plans(**args)  # from the memo
    assert len(rank_mod._scenario_memo) == 1
    monkeypatch.setattr(rank_mod, "SCENARIO_MEMO_SIZE", 0)
    fresh = rank_plans(**args)
    assert_frame_equal(again.table, fresh.table)
    assert_frame_equal(first.table, fresh.table)
    assert again.rejections.counts == fresh.rejections.counts == first.rejections.counts
    assert list(again.rejections.counts) == list(fresh.rejections.counts)  # the same order (most_common's ties)
    monkeypatch.setattr(rank_mod, "SCENARIO_MEMO_SIZE", 2)
    for gb in (64, 128, 256):
        rank_plans(**{**args, "workload": Workload(objective="dpo", seq_len=2048, global_batch=gb)})
    assert len(rank_mod._scenario_memo) == 2


def test_mixture_bounds_equal_the_reference_bit_for_bit():
    """models.stall.mixture_bounds (mixing rows only, both quantiles in one pass, spreads divided out before the
    loop) gives _mixture_bounds_reference's numbers exactly, with rows of one regime (p 0 or 1) and NaN among them."""
    from perfpredict.models.stall import _mixture_bounds_reference, mixture_bounds

    rng = np.random.default_rng(1)
    n = 2000
    free = 10 ** rng.uniform(-1, 1.5, n)
    lo, hi = free * rng.uniform(0.3, 1.0, n), free * rng.uniform(1.0, 3.0, n)
    stall = rng.uniform(0, 20, n) * (rng.random(n) < 0.9)
    p = rng.uniform(0, 1, n)
    p[:200], p[200:260], p[260:270], p[270:300] = 0.0, 1.0, np.nan, 1e-9
    args = (free, lo, hi, free + stall, lo + 0.5 * stall, hi + 2.0 * stall, p)
    for fast, ref in zip(mixture_bounds(*args), _mixture_bounds_reference(*args), strict=True):
        np.testing.assert_array_equal(fast, ref)
    none = mixture_bounds(*(a[:0] for a in args))
    assert none[0].shape == none[1].shape == (0,)


@pytest.mark.parametrize("name", ["mixtral-8xa100", "3b-128xh100-pp"])
def test_remembered_layout_probes_enumerate_as_fresh_ones(name, monkeypatch):
    """features.plans' per-process memo (_remembered: _layout_probe's layouts, _schedules' interleaved refusals,
    the stage splits and offloads): the same plans and the same rejection counts, in the same order, as probing every
    layout anew."""
    import perfpredict.features.plans as plans_mod

    model, cluster, workload, space = SCENARIOS[name]
    memo = plans_mod._PROBES
    memo.clear()
    runs = []
    for _ in range(2):  # probed, then remembered
        rej = Rejections()
        runs.append((plan_columns_frame(model, cluster, workload, space, rej), rej.counts))
    assert {"layout", "interleaved", "stages"} <= {key[0] for key in memo}
    memo.clear()
    monkeypatch.setattr(plans_mod, "LAYOUT_PROBE_MEMO", 0)  # cleared at every new entry: each probed anew
    rej = Rejections()
    fresh = plan_columns_frame(model, cluster, workload, space, rej)
    for frame, counts in runs:
        assert_frame_equal(frame, fresh)
        assert counts == rej.counts and list(counts) == list(rej.counts)
