from hypothesis import given, settings
from hypothesis import strategies as st

from perfpredict.core import Cluster, ModelSpec, Workload, get_gpu, get_model
from perfpredict.core.frameworks import why_not
from perfpredict.features.plans import PlanSpace, Rejections, enumerate_plans

H100 = get_gpu("h100-sxm-80gb")


def _check_legal(model, cluster, workload, plans):
    for p in plans:
        assert p.tp * p.pp * p.dp * p.cp == cluster.gpus
        assert model.heads % p.tp == 0 and model.kv_heads % p.tp == 0
        assert p.tp <= cluster.gpus_per_node
        stages = p.stage_layers or (model.layers // p.pp,) * p.pp
        assert sum(stages) == model.layers and len(stages) == p.pp
        assert all(n % p.virtual_stages == 0 for n in stages)
        assert p.micro_batch * p.grad_accum * p.dp == workload.global_batch
        if p.dp == 1 and p.zero:
            assert p.optimizer_offload  # ZeRO on one replica only to offload
        assert why_not(p, model) is None, p.label()
        if p.framework == "deepspeed":
            assert p.tp == 1 and p.cp == 1 and p.pp == 1
        if p.framework == "fsdp":
            assert p.pp == 1 and p.tp == 1 and p.zero in (2, 3)
        if p.framework == "nanotron":
            assert p.zero <= 1 and not p.optimizer_offload
        if p.schedule == "interleaved":
            assert p.grad_accum % p.pp == 0


def test_issue_example_counts_and_rejections():
    m = get_model("llama-3.1-8b")
    c = Cluster(H100, 8, 2)
    w = Workload(global_batch=64)
    rej = Rejections()
    plans = list(enumerate_plans(m, c, w, rejections=rej))
    assert len(plans) > 1000
    assert len(set(plans)) == len(plans)
    _check_legal(m, c, w, plans)
    assert rej.counts["deepspeed has no tensor parallelism"] > 0
    assert rej.total == sum(rej.counts.values())


@settings(max_examples=40, deadline=None)
@given(layers=st.sampled_from([12, 16, 24, 30, 32, 80]), heads=st.sampled_from([8, 12, 16, 32, 64]),
       kv_div=st.sampled_from([1, 2, 4, 8]), nodes=st.integers(1, 4), gpn=st.sampled_from([1, 2, 4, 8]),
       gb=st.sampled_from([1, 6, 16, 48, 64, 128]))
def test_every_yielded_plan_is_legal(layers, heads, kv_div, nodes, gpn, gb):
    kv = max(1, heads // kv_div)
    m = ModelSpec(name="t", layers=layers, hidden=heads * 64, heads=heads, kv_heads=kv, ffn=heads * 256, vocab=32000)
    c = Cluster(H100, gpn, nodes)
    w = Workload(objective="sft", seq_len=1024, global_batch=gb)
    plans = list(enumerate_plans(m, c, w, PlanSpace(max_cp=2)))
    _check_legal(m, c, w, plans)


def test_tp_must_divide_kv_heads():
    m = ModelSpec(name="t", layers=8, hidden=512, heads=8, kv_heads=2, ffn=1024, vocab=1000)
    plans = list(enumerate_plans(m, Cluster(H100, 8, 1), Workload(global_batch=8)))
    assert max(p.tp for p in plans) == 2
