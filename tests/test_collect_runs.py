"""Failure paths become rows (timeout, error, OOM) and a sweep resumes without re-running done run_ids."""

from __future__ import annotations

import polars as pl
import pytest

pytest.importorskip("torch")

from perfpredict.collect.harness import sweep  # noqa: E402
from perfpredict.collect.harness.runs import run_id, run_one  # noqa: E402
from perfpredict.collect.host import cluster_for  # noqa: E402
from perfpredict.core.errors import PerfPredictError  # noqa: E402
from perfpredict.core.model import ModelSpec  # noqa: E402
from perfpredict.core.plan import Plan  # noqa: E402
from perfpredict.core.scenario import Scenario  # noqa: E402
from perfpredict.core.workload import Workload  # noqa: E402

TINY = ModelSpec(name="tiny-test", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256)


def scenario(plan: Plan = Plan(dp=2, micro_batch=1), objective: str = "sft") -> Scenario:
    w = Workload(objective=objective, seq_len=32, global_batch=plan.micro_batch * plan.grad_accum * plan.dp,
                 precision="fp32")
    return Scenario(model=TINY, cluster=cluster_for(plan.gpus), workload=w, plan=plan)


@pytest.mark.slow
@pytest.mark.parametrize("fail,outcome,timeout", [("hang", "timeout", 12), ("error", "error", 120),
                                                   ("oom", "oom", 120)])
def test_failed_run_is_a_row(fail, outcome, timeout):
    r = run_one(scenario(), timeout_s=timeout, warmup=1, steps=1, max_retries=2, quiet_wait_s=0, fail=fail)
    assert r["outcome"] == outcome
    assert r["error"]
    assert r["step_time_s"] is None and r["peak_memory_gib"] is None
    assert r["attempts"] == 1  # failures are not retried by the noise gate
    assert r["calib_ratio"] > 0 and r["other_load_cores"] >= 0 and r["steal_cores"] >= 0
    if fail == "oom":
        assert "allocate" in r["error"]


def test_illegal_plan_is_a_one_line_error():
    with pytest.raises(PerfPredictError, match="kv_heads"):
        run_one(scenario(Plan(tp=4, micro_batch=1)), timeout_s=5)
    with pytest.raises(PerfPredictError, match="pipeline"):
        run_one(scenario(Plan(pp=2, dp=2, micro_batch=1, grad_accum=2)), timeout_s=5)


def test_run_id_is_stable_and_specific():
    a = run_id(scenario(), warmup=2, steps=5, seed=0, threads=1)
    assert a == run_id(scenario(), warmup=2, steps=5, seed=0, threads=1)
    assert a != run_id(scenario(), warmup=2, steps=6, seed=0, threads=1)
    assert a != run_id(scenario(objective="pretrain"), warmup=2, steps=5, seed=0, threads=1)


def test_resume_skips_done_run_ids(tmp_path, monkeypatch):
    calls = []

    def fake_run_one(sc, **kw):
        calls.append(sc)
        rid = run_id(sc, warmup=kw["warmup"], steps=kw["steps"], seed=kw["seed"], threads=1)
        return {"run_id": rid, "outcome": "ok", "error": None, "step_time_s": 1.0, "step_time_cv": 0.0,
                "peak_memory_gib": 0.1, "calib_ratio": 1.0, "other_load_cores": 0.0, "attempts": 1}

    monkeypatch.setattr(sweep, "run_one", fake_run_one)
    sweep.run_sweep(n=3, models=("tiny-llama",), out_dir=tmp_path, seed=1, progress=False)
    assert len(calls) == 3
    assert pl.read_parquet(tmp_path / "runs.parquet").height == 3
    sweep.run_sweep(n=3, models=("tiny-llama",), out_dir=tmp_path, seed=1, progress=False)
    assert len(calls) == 3  # nothing re-run
    sweep.run_sweep(n=5, models=("tiny-llama",), out_dir=tmp_path, seed=1, progress=False)
    assert len(calls) == 5  # only the two new ones
    df = pl.read_parquet(tmp_path / "runs.parquet")
    assert df.height == 5 and df["run_id"].n_unique() == 5
