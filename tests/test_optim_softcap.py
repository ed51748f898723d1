"""Issue 19 memory terms: the workload's optimizer (core.frameworks OPTIMIZERS), Gemma 2's soft-capped logits
(ModelSpec.final_logit_softcapping), transformers' logits path (features.memory.HF_LOGIT_BYTES) and the one ZeRO-3
gathered-parameter rule per engine (features.memory.zero3_gathered_bytes)."""

from __future__ import annotations

import json

import polars as pl
import pytest

from perfpredict.core.catalog import get_gpu, get_model
from perfpredict.core.errors import PerfPredictError
from perfpredict.core.frameworks import BNB_8BIT_MOMENT_BYTES, CAPABILITIES, DS_PREFETCH_BUCKET_HIDDEN2, OPTIMIZERS
from perfpredict.core.hardware import Cluster
from perfpredict.core.hf_config import model_from_hf_config
from perfpredict.core.model import ModelSpec
from perfpredict.core.plan import Plan
from perfpredict.core.scenario import flat_row
from perfpredict.core.workload import Workload
from perfpredict.features.descriptors import describe
from perfpredict.features.frame import plans_frame
from perfpredict.features.memory import HF_LOGIT_BYTES
from perfpredict.train.data import load_runs

SFT = Workload(objective="sft", seq_len=1024, global_batch=64)
FSDP = Plan(dp=8, zero=3, framework="fsdp", recompute="full")


def _one(model, plan: Plan, workload: Workload = SFT, gpus: int = 8) -> dict:
    m = get_model(model) if isinstance(model, str) else model
    return describe(plans_frame(m, Cluster(get_gpu("h100-sxm-80gb"), gpus, 1), workload, [plan])).row(0, named=True)


# --- the optimizer --------------------------------------------------------------------------------------------------

def test_optimizer_names_checked_and_default_left_out_of_dicts():
    with pytest.raises(PerfPredictError, match="unknown optimizer 'sgd'; accepted: adamw_torch"):
        Workload(optimizer="sgd")
    assert "optimizer" not in Workload().to_dict()
    assert Workload(optimizer="adamw_bnb_8bit").to_dict()["optimizer"] == "adamw_bnb_8bit"
    row = flat_row(get_model("llama-3.1-8b"), Cluster(get_gpu("h100-sxm-80gb"), 8, 1), Workload(), Plan())
    assert "w_optimizer" not in row and "m_logit_softcap" not in row  # committed datasets keep their schema


def test_default_optimizer_is_what_plans_had():
    assert OPTIMIZERS[""].moment_bytes is None and OPTIMIZERS[""].foreach_step is None
    base = _one("llama-3.1-8b", FSDP)
    torch_adamw = _one("llama-3.1-8b", FSDP, Workload(objective="sft", seq_len=1024, global_batch=64,
                                                      optimizer="adamw_torch"))
    # FSDP under the Trainer already steps torch AdamW with foreach on a GPU: naming it changes nothing
    for k in ("d_optim_bpp", "d_step_transient_bytes", "d_mem_gib"):
        assert torch_adamw[k] == pytest.approx(base[k], rel=1e-12)


def test_bnb_8bit_states_and_no_foreach_temporary():
    base = _one("llama-3.1-8b", FSDP)
    w8 = _one("llama-3.1-8b", FSDP, Workload(objective="sft", seq_len=1024, global_batch=64,
                                            optimizer="adamw_bnb_8bit"))
    paged = _one("llama-3.1-8b", FSDP, Workload(objective="sft", seq_len=1024, global_batch=64,
                                               optimizer="paged_adamw_8bit"))
    # bitsandbytes: a uint8 moment + one fp32 absmax per 2048 elements, twice (Optimizer2State.init_state)
    assert BNB_8BIT_MOMENT_BYTES == pytest.approx(1.0 + 4.0 / 2048)
    assert base["d_optim_bpp"] - w8["d_optim_bpp"] == pytest.approx((8.0 - 2 * BNB_8BIT_MOMENT_BYTES) / 8)
    assert w8["d_step_transient_bytes"] == 0.0 < base["d_step_transient_bytes"]
    # paged states live outside the allocator (CUDA managed memory)
    assert paged["d_optim_bpp"] == pytest.approx(base["d_optim_bpp"] - 8.0 / 8)
    fused = _one("llama-3.1-8b", FSDP, Workload(objective="sft", seq_len=1024, global_batch=64,
                                               optimizer="adamw_torch_fused"))
    assert fused["d_step_transient_bytes"] == 0.0 and fused["d_optim_bpp"] == base["d_optim_bpp"]


def test_handbook_mixtral_orpo_ran_8bit_adamw_and_fits():
    """The alignment handbook's zephyr-orpo-141b-A35b ran `optim: adamw_bnb_8bit` (recipe config_full.yaml at
    70769f9e) under FSDP on 32 H100: with fp32 Adam states it was composed at 81.9 GiB (a false OOM)."""
    runs = load_runs("datasets").filter(pl.col("transcribed_row") == "zephyr-orpo-141b-A35b")
    assert runs["w_optimizer"].to_list() == ["adamw_bnb_8bit"]
    assert describe(runs)["d_mem_gib"][0] < 0.8 * 80


# --- transformers' logits path and Gemma 2's soft-capping -----------------------------------------------------------

def _replay_peak_per_logit(softcap: float) -> float:
    """transformers' head + loss (>= 4.46 ForCausalLMLoss; with Gemma2ForCausalLM's three soft-capping lines first)
    forward and backward on CPU: the allocator's running peak per [N, V] logit."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    from perfpredict.collect.harness.run_step import profiled_peak_bytes

    n, v, h = 128, 4096, 16
    hidden = torch.randn(n, h, dtype=torch.bfloat16, requires_grad=True)
    weight = (torch.randn(v, h, dtype=torch.bfloat16) * 0.02).requires_grad_()
    labels = torch.randint(0, v, (1, n))

    def step() -> None:
        logits = (hidden @ weight.t()).unsqueeze(0)
        if softcap:
            logits = logits / softcap
            logits = torch.tanh(logits)
            logits = logits * softcap
        target = F.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
        upcast = logits.float()
        del logits  # the Trainer drops the model's outputs before the backward
        loss = F.cross_entropy(upcast.view(-1, v), target.view(-1), ignore_index=-100, reduction="sum") / n
        del upcast
        loss.backward()

    return profiled_peak_bytes(step) / (n * v)


def test_logits_path_bytes_replayed():
    plain, capped = _replay_peak_per_logit(0.0), _replay_peak_per_logit(30.0)
    assert plain == pytest.approx(HF_LOGIT_BYTES, rel=0.02)
    assert capped - plain == pytest.approx(2.0, abs=0.05)  # tanh's saved output, bf16


def test_gemma2_catalog_and_config_carry_the_cap(tmp_path):
    for name in ("gemma-2-2b", "gemma-2-9b", "gemma-2-27b"):
        assert get_model(name).final_logit_softcapping == 30.0
    assert get_model("llama-3.1-8b").final_logit_softcapping == 0.0
    cfg = {"model_type": "gemma2", "hidden_size": 2304, "num_attention_heads": 8, "num_key_value_heads": 4,
           "num_hidden_layers": 26, "vocab_size": 256000, "head_dim": 256, "intermediate_size": 9216,
           "final_logit_softcapping": 30.0}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert model_from_hf_config(tmp_path / "config.json").final_logit_softcapping == 30.0
    with pytest.raises(PerfPredictError, match="final_logit_softcapping"):
        ModelSpec.from_dict({**get_model("gemma-2-2b").to_dict(), "final_logit_softcapping": -1.0})


def test_softcap_adds_one_compute_dtype_tensor_per_logit():
    gemma = get_model("gemma-2-2b")
    uncapped = ModelSpec.from_dict({**gemma.to_dict(), "final_logit_softcapping": 0.0})
    plan = Plan(dp=4, zero=3, framework="fsdp", recompute="full", micro_batch=4)
    a, b = _one(gemma, plan, gpus=4), _one(uncapped, plan, gpus=4)
    tokens = 4 * SFT.seq_len
    assert a["d_logits_bytes"] - b["d_logits_bytes"] == pytest.approx(tokens * gemma.vocab * 2.0)
    fused = Plan(dp=4, zero=3, framework="fsdp", recompute="full", micro_batch=4, fused_head=True)
    assert _one(gemma, fused, gpus=4)["d_logits_bytes"] == _one(uncapped, fused, gpus=4)["d_logits_bytes"]


# --- ZeRO-3's gathered parameters: one rule per engine --------------------------------------------------------------

def test_deepspeed_keeps_the_head_and_the_layers_within_half_the_reuse_distance():
    m = get_model("llama-3.1-8b")  # head 525M elements > 5e8: no layer is kept, the head is
    ds = _one(m, Plan(dp=8, zero=3, framework="deepspeed", recompute="full"))
    head = m.vocab * m.hidden
    assert ds["d_gathered_bytes"] == pytest.approx((head + DS_PREFETCH_BUCKET_HIDDEN2 * m.hidden ** 2) * 2.0)
    mistral = get_model("mistral-7b")  # head 134M: + ceil((5e8 - 134M) / layer) layers
    got = _one(mistral, Plan(dp=8, zero=3, framework="deepspeed", recompute="full"))["d_gathered_bytes"]
    head = mistral.vocab * mistral.hidden
    layers = -(-(5e8 - head) // mistral.layer_params)
    assert got == pytest.approx((head + layers * mistral.layer_params + DS_PREFETCH_BUCKET_HIDDEN2 *
                                 mistral.hidden ** 2) * 2.0)
    small = _one("qwen2.5-0.5b", Plan(dp=8, zero=3, framework="deepspeed", recompute="full"))
    assert small["d_gathered_bytes"] == pytest.approx(small["d_params_rank"] * 2.0)  # all of it within reach
    alone = _one("qwen2.5-0.5b", Plan(dp=1, zero=3, framework="trl+deepspeed", recompute="full"),
                 Workload(objective="dpo", seq_len=512, global_batch=8), gpus=1)
    assert alone["d_gathered_bytes"] == 0.0


def test_fsdp_keeps_two_blocks_and_the_head():
    m = get_model("llama-3.1-8b")
    got = _one(m, FSDP)["d_gathered_bytes"]
    assert got == pytest.approx((2 * m.layer_params + m.vocab * m.hidden) * 2.0)


def test_bnb_optimizer_plans_never_offload():
    from perfpredict.features.plans import enumerate_plans

    cluster = Cluster(get_gpu("h100-sxm-80gb"), 8, 1)
    m = get_model("llama-3.1-8b")
    default = list(enumerate_plans(m, cluster, Workload()))
    w8 = list(enumerate_plans(m, cluster, Workload(optimizer="adamw_bnb_8bit")))
    assert any(p.optimizer_offload for p in default)
    assert w8 and not any(p.optimizer_offload for p in w8)
    hf = {f for f, c in CAPABILITIES.items() if c.hf_trainer}
    assert {p for p in default if not p.optimizer_offload and p.framework in hf} == set(w8)


@pytest.mark.parametrize("framework", [f for f, c in CAPABILITIES.items() if c.rankable and not c.hf_trainer])
def test_a_named_optimizer_runs_only_under_transformers_trainer(framework):
    # transformers' `optim` names are read by its Trainer loop only; Megatron and nanotron build their own optimizer,
    # so a plan of theirs is neither ranked nor accepted for a workload that names one.
    from perfpredict.core.frameworks import why_not
    from perfpredict.core.scenario import Scenario
    from perfpredict.features.plans import PlanSpace, enumerate_plans

    m = get_model("llama-3.1-8b")
    cap = CAPABILITIES[framework]
    objective = cap.trainers[0].objectives[0] if cap.trainers else "dpo"  # one it runs (nanotron: pretraining)
    w8 = Workload(objective=objective, optimizer="adamw_bnb_8bit")
    cluster = Cluster(get_gpu("h100-sxm-80gb"), 8, 1)
    assert any(enumerate_plans(m, cluster, Workload(objective=objective), PlanSpace(frameworks=(framework,))))
    assert not any(enumerate_plans(m, cluster, w8, PlanSpace(frameworks=(framework,))))
    plan = Plan(dp=8, framework=framework, zero=1 if framework != "fsdp2" else 3)
    assert "builds its own optimizer" in why_not(plan, m, objective=objective, optimizer="adamw_bnb_8bit")
    with pytest.raises(PerfPredictError, match="optim 'adamw_bnb_8bit' runs on"):
        Scenario.from_dict({"model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm-80gb", "gpus": 8},
                            "workload": {"objective": objective, "optimizer": "adamw_bnb_8bit"},
                            "plan": {"framework": framework, "dp": 8, "zero": plan.zero}})


def test_rank_cli_takes_the_optimizer():
    from typer.testing import CliRunner

    from perfpredict.cli import app

    bad = CliRunner().invoke(app, ["rank", "--model", "llama-3.1-8b", "--gpu", "h100-sxm-80gb", "--optimizer", "sgd"])
    assert bad.exit_code != 0 and "unknown optimizer 'sgd'" in bad.output and "Traceback" not in bad.output
