"""What the engines do on GPUs (issue 19 item 3), as the composition models it, and the physics it keeps:
DeepSpeed ZeRO-3's gathers across nodes (a slower inter-node link is strictly slower, a larger micro-batch hides more
of the gather) and its per-module hooks, ZeRO-3/FSDP gathers and reduce-scatters sharing the backward, recompute
granularity per framework (torchtitan's per-op SAC) and a live reference costing time, the trainers that run each
objective with their reference handling, the FSDP2 + TP runtime, and --explain naming those terms."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

import perfpredict
from perfpredict.core import Cluster, PerfPredictError, Plan, Scenario, Workload, get_gpu, get_model
from perfpredict.core.frameworks import CAPABILITIES, reference_handling, why_not
from perfpredict.features.descriptors import describe
from perfpredict.features.frame import plans_frame
from perfpredict.features.plans import PlanSpace, Rejections, enumerate_plans
from perfpredict.predictor.emit import emit
from perfpredict.predictor.predict import predict_frame
from perfpredict.predictor.rank import explain

c = pl.col
H100 = get_gpu("h100-sxm-80gb")
LLAMA8 = get_model("llama-3.1-8b")


def _frame(framework: str, gpus: int, mbs: tuple[int, ...], *, zero: int = 3, objective: str = "dpo",
           recompute: str = "none", global_batch: int | None = None) -> pl.DataFrame:
    cluster = Cluster(H100, 8, gpus // 8)
    gb = global_batch or gpus * 16
    w = Workload(objective=objective, seq_len=2048, global_batch=gb)
    plans = [Plan(framework=framework, dp=gpus, zero=zero, micro_batch=mb, grad_accum=gb // (gpus * mb),
                  recompute=recompute) for mb in mbs]
    return plans_frame(LLAMA8, cluster, w, plans)


@pytest.mark.parametrize("framework", ["deepspeed", "fsdp", "trl+deepspeed"])
def test_zero3_across_nodes_slower_inter_node_link_is_strictly_slower(framework):
    flat = _frame(framework, 32, (1, 2, 4))
    slow = flat.with_columns(c_inter_bw_gb_per_s=c("c_inter_bw_gb_per_s") / 4.0)
    t0, t1 = predict_frame(flat)["step_time_s"].to_numpy(), predict_frame(slow)["step_time_s"].to_numpy()
    assert np.all(t1 > t0), (t0, t1)


@pytest.mark.parametrize("framework", ["deepspeed", "fsdp"])
def test_larger_micro_batch_hides_more_of_the_zero3_gather(framework):
    """Same global batch, fewer and larger micro-batches: the same compute, fewer gathers of the whole model, so
    less of them is exposed (and DeepSpeed's hooks, a fixed host cost per module and pass, hide behind more)."""
    df = predict_frame(_frame(framework, 32, (1, 2, 4)))
    gather = df["e_zero3_gather_s"].to_numpy()
    assert gather[0] > gather[1] > gather[2] >= 0.0, gather
    hooks = df["e_zero3_hooks_s"].to_numpy()
    assert np.all(np.diff(hooks) <= 1e-12), hooks
    share = (gather + hooks) / df["step_time_s"].to_numpy()
    assert share[0] > share[2]


def test_deepspeed_zero3_hooks_cost_time_on_gpus_only_where_they_run():
    """DeepSpeed ZeRO-3 runs Python hooks per module on the host (also at micro-batch 1 on a GPU, where its GEMMs
    are shorter than the hooks); FSDP and DeepSpeed ZeRO-2 have none of them."""
    ds = predict_frame(_frame("deepspeed", 8, (1,)))
    assert ds["e_zero3_hooks_s"][0] > 0.0
    for fw, zero in (("fsdp", 3), ("deepspeed", 2)):
        assert predict_frame(_frame(fw, 8, (1,), zero=zero))["e_zero3_hooks_s"][0] == 0.0
    fsdp = predict_frame(_frame("fsdp", 8, (1,)))
    assert ds["step_time_s"][0] > fsdp["step_time_s"][0]


@pytest.mark.parametrize("framework, objective", [("fsdp2", "pretrain"), ("megatron", "pretrain"),
                                                  ("trl+fsdp", "dpo")])
def test_recompute_and_a_live_reference_cost_time(framework, objective):
    model, cluster = LLAMA8, Cluster(H100, 8, 1)
    w = Workload(objective=objective, seq_len=2048, global_batch=64)
    tp = 2 if CAPABILITIES[framework].tp else 1
    zero = 3 if framework != "megatron" else 1
    rcs = [r for r in ("none", "selective", "full") if r in CAPABILITIES[framework].recompute]
    plans = [Plan(framework=framework, tp=tp, dp=8 // tp, zero=zero, micro_batch=2, grad_accum=64 // (2 * 8 // tp),
                  recompute=r) for r in rcs]
    df = predict_frame(plans_frame(model, cluster, w, plans))
    t, rc = df["step_time_s"].to_numpy(), df["e_recompute_s"].to_numpy()
    assert np.all(np.diff(t) > 0), t
    assert rc[0] == 0.0 and np.all(rc[1:] > 0.0) and np.all(np.diff(rc) > 0), rc
    if objective == "dpo":
        flat = plans_frame(model, cluster, w, plans[:1])
        live = predict_frame(flat.with_columns(w_reference=pl.lit("live")))
        pre = predict_frame(flat.with_columns(w_reference=pl.lit("precomputed")))
        assert live["step_time_s"][0] > pre["step_time_s"][0]
        assert live["e_reference_fwd_s"][0] > 0.0 == pre["e_reference_fwd_s"][0]


def test_torchtitan_selective_recomputes_half_the_matmuls_megatron_the_attention():
    """torchtitan's per-op SAC (every second matmul and the elementwise ops) costs more than Megatron's selective
    (the core attention) on the same layout, and less than full recompute."""
    cluster, w = Cluster(H100, 8, 1), Workload(objective="pretrain", seq_len=2048, global_batch=64)
    rows = []
    for fw in ("fsdp2", "megatron"):
        for rc in ("selective", "full"):
            rows.append(Plan(framework=fw, tp=2, dp=4, zero=1 if fw == "megatron" else 3, micro_batch=2,
                             grad_accum=8, recompute=rc))
    df = predict_frame(plans_frame(LLAMA8, cluster, w, rows))
    rc = df["e_recompute_s"].to_numpy()
    sac, full_t, meg_sel, meg_full = rc
    assert meg_sel < sac < full_t and meg_sel < meg_full
    flops = describe(plans_frame(LLAMA8, cluster, w, rows))["d_flops_per_step"].to_numpy()
    assert flops[2] < flops[0] < flops[1]


def test_fsdp2_tp_plans_with_selective_checkpointing_are_accepted_and_ranked():
    sc = Scenario.from_dict({"model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8},
                             "workload": {"objective": "pretrain", "global_batch": 64, "seq_len": 2048},
                             "plan": {"framework": "fsdp2", "tp": 2, "sequence_parallel": True, "zero": 3,
                                      "recompute": "selective", "micro_batch": 2}})
    assert perfpredict.predict(sc).step_time_s > 0
    plans = list(enumerate_plans(LLAMA8, Cluster(H100, 8, 1), Workload(objective="pretrain", global_batch=64),
                                 PlanSpace(frameworks=("fsdp2",))))
    assert {p.recompute for p in plans} == {"none", "selective", "full"} and any(p.tp > 1 for p in plans)
    assert any(p.sequence_parallel for p in plans)
    # HF gradient checkpointing still recomputes whole layers: the refusal names who runs selective.
    msg = why_not(Plan(framework="deepspeed", dp=8, zero=3, recompute="selective"))
    assert "fsdp2" in msg and "megatron" in msg


def test_objectives_rank_only_where_a_real_trainer_runs_them():
    cluster = Cluster(H100, 8, 1)
    dpo = Workload(objective="dpo", global_batch=64)
    rej = Rejections()
    plans = list(enumerate_plans(LLAMA8, cluster, dpo, PlanSpace(frameworks=("megatron", "nanotron", "fsdp2")),
                                 rejections=rej))
    assert not any(p.framework == "nanotron" for p in plans)
    # NeMo-Aligner's DPO: distributed_fused_adam (zero <= 1), no optimizer offload.
    assert all(p.zero <= 1 and not p.optimizer_offload for p in plans if p.framework == "megatron")
    # NeMo-RL's DTensor DPO: no recompute we model.
    assert all(p.recompute == "none" for p in plans if p.framework == "fsdp2")
    assert any("no trainer runs dpo" in k for k in rej.counts)
    with pytest.raises(PerfPredictError, match="no Megatron-LM trainer runs simpo"):
        Scenario.from_dict({"model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8},
                            "workload": {"objective": "simpo", "global_batch": 64},
                            "plan": {"framework": "megatron", "tp": 2, "zero": 1}})
    with pytest.raises(PerfPredictError, match="NeMo-Aligner"):
        Scenario.from_dict({"model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8},
                            "workload": {"objective": "dpo", "global_batch": 64},
                            "plan": {"framework": "megatron", "tp": 2, "zero": 3}})


def test_live_reference_is_held_as_the_trainer_holds_it():
    assert reference_handling("megatron", "dpo", "live") == "offloaded"
    assert reference_handling("fsdp2", "dpo", "live") == "offloaded"
    assert reference_handling("trl+deepspeed", "dpo", "live") == "live"
    assert reference_handling("megatron", "dpo", "precomputed") == "precomputed"
    w = Workload(objective="dpo", seq_len=2048, global_batch=64)
    plans = [Plan(framework="megatron", tp=2, dp=4, zero=1, micro_batch=1, grad_accum=16),
             Plan(framework="deepspeed", dp=8, zero=1, micro_batch=1, grad_accum=8)]
    d = describe(plans_frame(LLAMA8, Cluster(H100, 8, 1), w, plans))
    assert d["w_reference"].to_list() == ["offloaded", "live"]
    # NeMo-Aligner's cpu_weight_swap moves the rank's bf16 weights three times per step (out, reference in, back).
    assert d["d_host_bytes"][0] == pytest.approx(3 * 2.0 * d["d_params_rank"][0])
    assert d["d_host_bytes"][1] == 0.0


@pytest.mark.parametrize("framework", ["trl", "fsdp2"])
def test_rank_explains_llama8b_dpo_on_8_h100_by_engine_terms(framework):
    from perfpredict.predictor.rank import rank_plans

    r = rank_plans(model=LLAMA8, cluster=Cluster(H100, 8, 1), workload=Workload(objective="dpo", global_batch=64),
                   space=PlanSpace(frameworks=(framework,)))
    assert r.fitting.height >= 2
    text = explain(r)
    for term in ("exposed ZeRO-3/FSDP gather", "ZeRO-3 hook overhead", "exposed grad reduce-scatter",
                 "recompute", "reference forward", "transformers eager ops"):
        assert term in text, text
    top = r.fitting.row(0, named=True)
    assert top["e_reference_fwd_s"] > 0.0  # DPO's reference forward is named, whoever holds it
    # TRL runs transformers' eager layers; torchtitan / NeMo-RL plans are not charged them.
    assert (top["e_hf_eager_s"] > 0.0) == (framework == "trl")


def test_fsdp2_emits_its_trainers_config():
    cluster = Cluster(H100, 8, 1)
    plan = Plan(framework="fsdp2", tp=2, dp=4, sequence_parallel=True, zero=3, micro_batch=2, grad_accum=8,
                recompute="selective")
    pre = emit("fsdp2", model=LLAMA8, cluster=cluster, workload=Workload(objective="pretrain", global_batch=64),
               plan=plan)
    mod = pre["perfpredict_torchtitan.py"]
    assert "SelectiveAC.Config()" in mod and "tensor_parallel_degree=2" in mod and "data_parallel_shard_degree=4" in mod
    assert "MODULE=perfpredict_torchtitan" in pre["launch.sh"]
    dpo = emit("torchrun", model=LLAMA8, cluster=cluster, workload=Workload(objective="dpo", global_batch=64),
               plan=Plan(framework="fsdp2", tp=2, dp=4, sequence_parallel=True, zero=3, micro_batch=2, grad_accum=8))
    launch = dpo["launch.sh"]
    assert "examples/run_dpo.py" in launch and "policy.dtensor_cfg.tensor_parallel_size=2" in launch
    assert "policy.train_micro_batch_size=2" in launch and "pinned host memory" in launch
    meg = emit("megatron", model=LLAMA8, cluster=cluster, workload=Workload(objective="dpo", global_batch=64),
               plan=Plan(framework="megatron", tp=2, dp=4, zero=1, micro_batch=2, grad_accum=8))
    assert "++model.dpo.preference_loss=dpo" in meg["nemo_aligner_overrides.txt"]


# FSDP under TRL/accelerate on GPUs (issue 19 item 3, second pass): the physics the FSDP terms keep.
FSDP_FRAMEWORKS = ["fsdp", "trl+fsdp", "fsdp2"]


@pytest.mark.parametrize("framework", FSDP_FRAMEWORKS)
def test_fsdp_more_inter_node_bandwidth_is_never_slower(framework):
    flat = _frame(framework, 32, (1, 2))
    steps = [predict_frame(flat.with_columns(c_inter_bw_gb_per_s=c("c_inter_bw_gb_per_s") * k))["step_time_s"]
             .to_numpy() for k in (0.125, 0.5, 1.0, 4.0)]
    for slow, fast in zip(steps[:-1], steps[1:], strict=True):
        assert np.all(fast <= slow + 1e-12), steps


@pytest.mark.parametrize("framework", FSDP_FRAMEWORKS)
def test_fsdp_larger_micro_batch_hides_more_of_the_gather_across_nodes(framework):
    """Same global batch on 4 nodes at a quarter of the inter-node link (gathers exposed): fewer, larger
    micro-batches gather the model fewer times, so less of the gather is exposed."""
    flat = _frame(framework, 32, (1, 2, 4))
    df = predict_frame(flat.with_columns(c_inter_bw_gb_per_s=c("c_inter_bw_gb_per_s") / 4.0))
    gather = df["e_zero3_gather_s"].to_numpy()
    assert gather[0] > gather[1] > gather[2] >= 0.0, gather


@pytest.mark.parametrize("framework", FSDP_FRAMEWORKS)
def test_fsdp_live_reference_costs_time(framework):
    """A live reference (TRL's prepare_fsdp shards it, so its forward gathers again) costs time over a precomputed
    one, also across nodes."""
    flat = _frame(framework, 32, (1,))
    live = predict_frame(flat.with_columns(w_reference=pl.lit("live")))
    pre = predict_frame(flat.with_columns(w_reference=pl.lit("precomputed")))
    assert live["step_time_s"][0] > pre["step_time_s"][0]
    assert live["e_reference_fwd_s"][0] > 0.0 == pre["e_reference_fwd_s"][0]


def test_transformers_eager_ops_are_charged_on_gpu_to_the_frameworks_that_run_them():
    """TRL/accelerate plans run transformers' eager layers (fp32 RMSNorm chain, rotary, repeat_kv: core.frameworks
    HF_EAGER_LAYER); Megatron and torchtitan do not. The term grows with the tokens and with recompute."""
    cluster, w = Cluster(H100, 8, 1), Workload(objective="dpo", seq_len=2048, global_batch=64)
    rows = [Plan(framework=fw, dp=8, zero=3, micro_batch=mb, grad_accum=8 // mb, recompute=rc)
            for fw in ("fsdp", "deepspeed", "trl+fsdp") for mb, rc in ((1, "none"), (2, "none"), (1, "full"))]
    df = predict_frame(plans_frame(LLAMA8, cluster, w, rows))
    e = df["e_hf_eager_s"].to_numpy().reshape(3, 3)
    assert np.all(e > 0.0)
    assert np.allclose(e[:, 0], e[:, 1], rtol=0.05)  # same tokens per step, same eager bytes
    assert np.all(e[:, 2] > e[:, 0])  # full recompute runs the eager forward again
    meg = predict_frame(plans_frame(LLAMA8, cluster, Workload(objective="pretrain", global_batch=64),
                                    [Plan(framework="megatron", tp=2, dp=4, zero=1, micro_batch=1, grad_accum=16),
                                     Plan(framework="fsdp2", tp=2, dp=4, zero=3, micro_batch=1, grad_accum=16)]))
    assert np.all(meg["e_hf_eager_s"].to_numpy() == 0.0)


def test_liger_layer_kernels_replace_the_eager_norms_rotary_and_mlp():
    """A plan with Liger's kernels (fused_head: use_liger_kernel swaps RMSNorm, rotary and SwiGLU too,
    core.frameworks LIGER_LAYER) keeps only the in-place rotary and transformers' own attention-path copies of the
    eager layer traffic: less eager time than the same plan without, still some, and never a slower step."""
    cluster, w = Cluster(H100, 8, 1), Workload(objective="sft", seq_len=2048, global_batch=64)
    rows = [Plan(framework=fw, dp=8, zero=3, micro_batch=2, grad_accum=4, recompute="full", fused_head=fh)
            for fw in ("fsdp", "deepspeed") for fh in (False, True)]
    df = predict_frame(plans_frame(LLAMA8, cluster, w, rows))
    e = df["e_hf_eager_s"].to_numpy().reshape(2, 2)
    assert np.all(e[:, 1] > 0.0) and np.all(e[:, 1] < 0.5 * e[:, 0])
    step = df["k_step_s"].to_numpy().reshape(2, 2)
    # DeepSpeed's ZeRO-3 step here is bound by its host hooks (k_hook_s), which a faster device does not shorten
    assert step[0, 1] < step[0, 0] and step[1, 1] <= step[1, 0] * (1.0 + 1e-12)


def test_padded_batches_run_at_the_slowest_rank():
    """Workload.seq_len_cv (padded batches' per-rank length spread): no spread changes nothing; a spread makes the
    step slower, more so with more data-parallel ranks to wait for, and less for a runtime that meets its ranks once
    per step (ZeRO-2 with gradient accumulation) than for one that gathers every layer (ZeRO-3)."""
    from perfpredict.features.compute import slowest_rank_factor

    def steps(cv: float, gpus: int, zero: int) -> np.ndarray:
        cluster = Cluster(H100, 8, 1)
        w = Workload(objective="sft", seq_len=512, global_batch=gpus * 32, seq_len_cv=cv)
        rows = [Plan(framework="fsdp", dp=gpus, zero=zero, micro_batch=8, grad_accum=4, recompute="full")]
        return predict_frame(plans_frame(LLAMA8, cluster, w, rows))["k_step_s"].to_numpy()

    base = steps(0.0, 8, 3)
    assert steps(0.0, 8, 3) == pytest.approx(base)
    assert steps(0.25, 8, 3)[0] > base[0]
    assert steps(0.25, 4, 3)[0] > steps(0.0, 4, 3)[0]
    f = pl.DataFrame({"w_seq_len_cv": [0.0, 0.25, 0.25, 0.25, 0.25], "p_dp": [8, 1, 4, 8, 8],
                      "p_zero": [3, 3, 3, 3, 2], "p_tp": [1] * 5, "p_pp": [1] * 5, "p_grad_accum": [4] * 5}
                     ).select(slowest_rank_factor()).to_series().to_list()
    assert f[0] == 1.0 and f[1] == 1.0  # no spread, or no other rank to wait for
    assert 1.0 < f[2] < f[3]  # more ranks, a slower slowest one: 1 + 0.25 x 1.05 at 4 ranks (Blom)
    assert f[2] == pytest.approx(1.0 + 0.25 * 1.049, abs=0.002)
    assert 1.0 < f[4] < f[3]  # ZeRO-2 meets once per step: the spread of a 4-micro-batch sum, 0.25 / 2


def test_expert_parallel_groups_strided_by_tp_cross_nodes():
    """Megatron lays an expert-parallel group's ranks tp apart (expert tensor parallelism = tp, order
    tp-cp-ep-dp-pp): ep 8 at tp 2 spans two 8-GPU nodes, so its all-to-all crosses the inter-node link (a slower one
    is strictly slower), where ep 8 at tp 1 stays on one node (the inter-node link does not matter)."""
    moe = get_model("qwen3-30b-a3b")
    w = Workload(objective="sft", seq_len=8192, global_batch=16)

    def ep_s(tp: int, inter: float) -> float:
        cluster = Cluster(get_gpu("a100-sxm-80gb"), 8, 2, inter_node_bw_gb_per_s=inter)
        plan = Plan(framework="megatron", tp=tp, dp=16 // tp, ep=8, zero=1, micro_batch=1,
                    grad_accum=16 // (16 // tp), recompute="full", sequence_parallel=tp > 1)
        return float(predict_frame(plans_frame(moe, cluster, w, [plan]))["k_ep_s"][0])

    assert ep_s(2, 12.5) > ep_s(2, 25.0) > 0.0
    assert ep_s(1, 12.5) == pytest.approx(ep_s(1, 25.0))


def test_fsdp_under_the_hf_trainer_keeps_unsharded_grads_and_reduces_once():
    """transformers' Trainer runs all but the last micro-batch in accelerate's no_sync; FSDP2 then keeps every
    block's unsharded gradient (compute dtype) until the step's single reduce-scatter. DeepSpeed (which the Trainer
    leaves out of no_sync) and torchtitan's FSDP2 reduce every micro-batch and hold no such gradients."""
    cluster, w = Cluster(H100, 8, 1), Workload(objective="dpo", seq_len=2048, global_batch=64)
    rows = [Plan(framework=fw, dp=8, zero=3, micro_batch=1, grad_accum=ga)
            for fw in ("fsdp", "trl+fsdp", "deepspeed", "fsdp2") for ga in (1, 8)]
    d = describe(plans_frame(LLAMA8, cluster, w, rows))
    syncs = d["d_dp_syncs"].to_numpy().reshape(4, 2)
    gathered = d["d_gathered_bytes"].to_numpy().reshape(4, 2)
    params = d["d_params_rank"].to_numpy().reshape(4, 2)
    for i in (0, 1):  # fsdp, trl+fsdp: one sync per step, + the bf16 unsharded model's gradients with ga > 1
        assert syncs[i].tolist() == [1.0, 1.0]
        assert gathered[i, 1] - gathered[i, 0] == pytest.approx(2.0 * params[i, 1])
    for i in (2, 3):  # deepspeed, fsdp2 (torchtitan/NeMo-RL): every micro-batch, nothing more held
        assert syncs[i].tolist() == [1.0, 8.0]
        assert gathered[i, 1] == pytest.approx(gathered[i, 0])
