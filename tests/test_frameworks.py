"""The framework capability table (core.frameworks) is the one source of legality: every plan the generator (and so
`rank`) yields is runnable by its framework and can be emitted for it; the uneven-stage, expert-parallel and offload
plans the table allows appear and are predicted."""

import pytest

import perfpredict
from perfpredict.core import Cluster, PerfPredictError, Plan, Scenario, Workload, get_gpu, get_model
from perfpredict.core.frameworks import CAPABILITIES, RANKABLE, capability, stage_layers, why_not
from perfpredict.core.scenario import plan_from_columns
from perfpredict.features.plans import PlanSpace, Rejections, enumerate_plans
from perfpredict.predictor.emit import emit
from perfpredict.predictor.emit.common import fit
from perfpredict.predictor.rank import RANK_ORDER

H100 = get_gpu("h100-sxm-80gb")
CASES = [  # (model, gpus per node, nodes, global batch): dense, MoE, 28 layers (uneven pp), one GPU
    ("llama-3.1-8b", 8, 2, 64), ("mixtral-8x7b", 8, 2, 32), ("llama-3.2-3b", 8, 1, 16), ("llama-3.2-1b", 1, 1, 8),
]


@pytest.mark.parametrize("framework", RANKABLE)
def test_every_generated_plan_runs_and_emits_for_its_framework(framework):
    cap = capability(framework)
    seen = 0
    # DPO where one of the framework's trainers runs it (core.frameworks Trainer rows), else pretraining.
    objective = "dpo" if cap.trainer_for("dpo") else "pretrain"
    for name, gpn, nodes, gb in CASES:
        model, cluster = get_model(name), Cluster(H100, gpn, nodes)
        w = Workload(objective=objective, seq_len=2048, global_batch=gb)
        plans = list(enumerate_plans(model, cluster, w, PlanSpace(frameworks=(framework,))))
        seen += len(plans)
        for i, p in enumerate(plans):
            # A framework with backends (trl) brings them along; each plan is its own backend's.
            assert p.framework in (framework, *cap.backends)
            assert why_not(p, model, objective=objective) is None, p.label()
            Scenario(model=model, cluster=cluster, workload=w, plan=p)
            target = capability(p.framework).emit_target
            if target:
                assert fit(target, p, w, model) is None, p.label()
                if i % 97 == 0:  # writing every config is slow; a spread sample is written in full
                    assert emit(target, model=model, cluster=cluster, workload=w, plan=p)
    assert seen > 0


@pytest.mark.parametrize("framework", ["megatron", "deepspeed", "fsdp"])
def test_rank_rows_emit_for_their_framework(framework):
    model = get_model("llama-3.2-3b")
    cluster = Cluster(H100, 8, 1)
    w = Workload(objective="dpo", seq_len=2048, global_batch=16)
    df = perfpredict.rank(model=model, cluster=cluster, workload=w, frameworks=[framework])
    assert df.height > 0
    for row in df.iter_rows(named=True):
        p = plan_from_columns(row)
        assert fit(framework, p, w, model) is None, row["plan"]


def test_trl_is_ranked_when_asked_for():
    trl = CAPABILITIES["trl"]
    assert trl.backends == ("trl+deepspeed", "trl+fsdp") and trl.rankable and trl.zero_stages == (0,)
    assert not CAPABILITIES["trl+fsdp"].tp and CAPABILITIES["trl+deepspeed"].param_offload_zero == (3,)
    assert {"trl", "trl+deepspeed", "trl+fsdp"} <= set(RANKABLE)
    assert Plan(framework="trl+deepspeed", zero=3, dp=2).framework == "trl+deepspeed"
    with pytest.raises(PerfPredictError, match="no tensor parallelism"):
        Scenario.from_dict({"model": "llama-3.2-1b", "hardware": {"gpu": "h100-sxm-80gb", "gpus_per_node": 2},
                            "workload": {"global_batch": 4}, "plan": {"tp": 2, "framework": "trl"}})


def test_stage_splits_follow_each_framework():
    split = stage_layers(capability("nanotron"), 28, 8)
    assert sorted(split) == [3, 3, 3, 3, 4, 4, 4, 4]
    assert split[0] == 3 and split[-1] == 3 and sum(split) == 28  # embedding/head stages get the lighter counts
    meg = stage_layers(capability("megatron"), 28, 8)
    assert sum(meg) == 28 and len(set(meg[1:-1])) == 1 and max(meg) == 4
    assert stage_layers(capability("harness"), 28, 8) is None
    assert stage_layers(capability("megatron"), 32, 8) == (4,) * 8


def test_uneven_pipeline_is_predicted_and_ranked():
    # SFT: both 3-D trainers run it (nanotron has no preference trainer: core.frameworks Trainer rows).
    base = {"model": "llama-3.2-3b", "hardware": {"gpu": "h100-sxm-80gb", "gpus": 8},
            "workload": {"objective": "sft", "global_batch": 64}}
    # nanotron balances its pipeline blocks itself: the split is filled in as it makes it.
    s = Scenario.from_dict({**base, "plan": {"pp": 8, "framework": "nanotron"}})
    assert sum(s.plan.stage_layers) == 28 and len(s.plan.stage_layers) == 8
    # Megatron needs the split given (--decoder-first/last-pipeline-num-layers); the error shows one that works.
    with pytest.raises(PerfPredictError, match="stage_layers"):
        Scenario.from_dict({**base, "plan": {"pp": 8, "framework": "megatron"}})
    with pytest.raises(PerfPredictError, match="middle stages must be equal"):
        Scenario.from_dict({**base, "plan": {"pp": 8, "framework": "megatron", "stage_layers": [2, 3, 4, 4, 4, 4, 4, 3]}})
    ok = perfpredict.predict({**base, "plan": {"pp": 8, "framework": "megatron", "stage_layers": [2, 4, 4, 4, 4, 4, 4, 2]}})
    assert ok.step_time_s > 0
    rej = Rejections()
    plans = list(enumerate_plans(get_model("llama-3.2-3b"), Cluster(H100, 8, 2),
                                 Workload(objective="sft", global_batch=64), rejections=rej))
    uneven = [p for p in plans if p.stage_layers]
    assert {p.pp for p in uneven} >= {8, 16} and {p.framework for p in uneven} == {"megatron", "nanotron"}
    assert rej.counts["deepspeed has no pipeline parallelism"] > 0


def test_slowest_stage_sets_time_and_memory():
    m = get_model("llama-3.2-3b")
    w = Workload(objective="pretrain", seq_len=2048, global_batch=64)
    cl = Cluster(H100, 8, 1)

    def pred(stages):
        p = Plan(pp=8, dp=1, micro_batch=1, grad_accum=64, framework="megatron", stage_layers=stages)
        return perfpredict.predict(Scenario(model=m, cluster=cl, workload=w, plan=p))

    balanced, lopsided = pred((2, 4, 4, 4, 4, 4, 4, 2)), pred((1, 5, 5, 5, 5, 5, 1, 1))
    assert lopsided.step_time_s > balanced.step_time_s
    assert lopsided.peak_memory_gib > balanced.peak_memory_gib


def test_expert_parallel_plans_shard_expert_weights():
    m = get_model("mixtral-8x7b")
    cl = Cluster(H100, 8, 2)
    w = Workload(objective="sft", seq_len=4096, global_batch=32)
    plans = list(enumerate_plans(m, cl, w, PlanSpace(frameworks=("megatron",))))
    assert any(p.ep == 8 for p in plans)
    dense = get_model("llama-3.1-8b")
    assert all(p.ep == 1 for p in enumerate_plans(dense, cl, Workload(global_batch=32)))

    def pred(ep):
        p = Plan(tp=1, dp=16, ep=ep, zero=1, micro_batch=1, grad_accum=2, framework="megatron", recompute="full")
        return perfpredict.predict(Scenario(model=m, cluster=cl, workload=w, plan=p))

    one, eight = pred(1), pred(8)
    assert eight.breakdown["states_gib"] < one.breakdown["states_gib"] / 2
    with pytest.raises(PerfPredictError, match="dense"):
        Scenario(model=dense, cluster=cl, workload=Workload(global_batch=32),
                 plan=Plan(dp=16, ep=2, micro_batch=1, grad_accum=2))


def test_offload_on_one_gpu():
    m, cl = get_model("llama-3.1-8b"), Cluster(H100, 1, 1)
    w = Workload(objective="dpo", seq_len=1024, global_batch=8)
    plans = list(enumerate_plans(m, cl, w))
    offl = [p for p in plans if p.optimizer_offload]
    # Megatron's DPO trainer (NeMo-Aligner) has no optimizer offload; Megatron-LM offloads for SFT.
    assert {p.framework for p in offl} >= {"deepspeed", "fsdp"} and "megatron" not in {p.framework for p in offl}
    sft = Workload(objective="sft", seq_len=1024, global_batch=8)
    assert any(p.optimizer_offload and p.framework == "megatron" for p in enumerate_plans(m, cl, sft))
    assert any(p.param_offload and p.zero == 3 for p in offl)
    df = perfpredict.rank(model=m, cluster=cl, workload=w)
    assert df.height and df["p_offload"][0]  # 8B DPO fits one H100 only by offloading


def test_cp_with_deepspeed_is_refused_in_predict():
    with pytest.raises(PerfPredictError, match="no context parallelism"):
        Scenario.from_dict({"model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm-80gb", "gpus": 8},
                            "workload": {"global_batch": 64}, "plan": {"cp": 2, "framework": "deepspeed"}})


def test_collect_harness_row():
    harness = CAPABILITIES["harness"]
    m = get_model("llama-3.2-1b")
    assert why_not(Plan(cp=2, framework="fsdp"), m, framework="harness")
    assert why_not(Plan(pp=2, dp=2, framework="fsdp"), m, framework="harness")
    assert why_not(Plan(pp=2, schedule="gpipe", framework="fsdp"), m, framework="harness") is None
    assert harness.records_as == "fsdp" and not harness.rankable


def test_emitted_configs_carry_ep_stages_and_param_offload():
    import json as _json

    m = get_model("mixtral-8x7b")
    cl = Cluster(H100, 8, 2)
    w = Workload(objective="pretrain", seq_len=4096, global_batch=32)
    text = emit("megatron", model=m, cluster=cl, workload=w,
                plan=Plan(pp=2, dp=8, ep=4, zero=1, micro_batch=1, grad_accum=4,
                          framework="megatron"))["megatron_args.txt"]
    assert "--expert-model-parallel-size 4" in text
    m3 = get_model("llama-3.2-3b")
    text = emit("megatron", model=m3, cluster=Cluster(H100, 8, 1), workload=Workload(objective="pretrain",
                                                                                     global_batch=8),
                plan=Plan(pp=8, dp=1, micro_batch=1, grad_accum=8, framework="megatron",
                          stage_layers=(2, 4, 4, 4, 4, 4, 4, 2)))["megatron_args.txt"]
    assert "--decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 2" in text
    files = emit("deepspeed", model=get_model("llama-3.1-8b"), cluster=Cluster(H100, 1, 1),
                 workload=Workload(objective="dpo", global_batch=8),
                 plan=Plan(dp=1, zero=3, micro_batch=1, grad_accum=8, optimizer_offload=True, param_offload=True,
                           framework="deepspeed"))
    cfg = _json.loads(next(v for k, v in files.items() if k.endswith(".json")))
    assert cfg["zero_optimization"]["offload_param"]["device"] == "cpu"


def _in_rank_order(a: tuple, b: tuple) -> bool:
    """Row a may precede row b under RANK_ORDER: the first column where they differ goes the ranking's way."""
    for x, y, (_, descending) in zip(a, b, RANK_ORDER, strict=True):
        if x != y:
            return x > y if descending else x < y
    return True


def test_ties_prefer_less_memory_and_breakdown_adds_up():
    df = perfpredict.rank(model="llama-3.1-8b", cluster=Cluster(H100, 8, 2), workload=Workload(global_batch=64))
    # The order the ranking sorts by (predictor.rank.RANK_ORDER: fits, the expected throughput over the stall
    # regimes, memory, label), not a copy of it that could drift.
    cols = [k for k, _ in RANK_ORDER]
    assert cols[:3] == ["fits", "expected_samples_per_s", "peak_memory_gib"]
    rows = df.select(cols).rows()
    # ties exist (SP on/off moves no time here) and go to the plan needing less memory
    assert any(a[:2] == b[:2] and a[2] < b[2] for a, b in zip(rows, rows[1:], strict=False))
    assert all(_in_rank_order(a, b) for a, b in zip(rows, rows[1:], strict=False))
    parts = df["mem_states_gib"] + df["mem_activations_gib"] + df["mem_logits_gib"] + df["mem_reference_gib"] + \
        df["mem_other_gib"]
    assert ((parts - df["peak_memory_gib"]).abs() < 1e-6 * df["peak_memory_gib"]).all()
    again = perfpredict.rank(model="llama-3.1-8b", cluster=Cluster(H100, 8, 2), workload=Workload(global_batch=64))
    assert again["plan"].to_list() == df["plan"].to_list()


def test_frameworks_command_lists_the_table():
    from typer.testing import CliRunner

    from perfpredict.cli import app

    r = CliRunner().invoke(app, ["frameworks"])
    assert r.exit_code == 0 and "trl" in r.stdout and "megatron" in r.stdout
