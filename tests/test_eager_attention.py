"""transformers' eager attention (plan eager_attention, issue 19 item 3): the materialised [b, heads, s, s] scores,
their fp32 softmax and the full-square score GEMMs, charged wherever a plan runs that code path; the alignment
handbook's DPO run (TRL 0.7.7, transformers 4.36 Mistral without flash attention) carries it.

Reference numbers: the handbook DPO plan (recipes/zephyr-7b-beta/dpo/config_full.yaml at f0ffa0d: 8 pairs per GPU,
accumulation 2, max_length 1024, gradient checkpointing) concatenates chosen and rejected, 16 sequences per
micro-batch (trl/trainer/dpo_trainer.py:866-910 at v0.7.7, concatenated_forward); Mistral-7B has 32 layers and 32
heads: 16 x 32 x 1024 x 1024 = 536,870,912 score elements per layer and micro-batch, in three forwards (policy, its
recompute, the live reference) and one backward: 32 x 2 x (3 x 12 + 14) / 3 'add'-kernel units
(core.frameworks EAGER_ATTENTION: 12 moves forward, 14 backward, models/mistral/modeling_mistral.py:96-118)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from perfpredict.core import Cluster, PerfPredictError, Plan, Workload, get_gpu, get_model
from perfpredict.core.frameworks import EAGER_ATTENTION
from perfpredict.features.descriptors import describe
from perfpredict.features.frame import plans_frame
from perfpredict.models.bundle import default_bundle
from perfpredict.models.compose import kernel_queries

c = pl.col
H100 = get_gpu("h100-sxm-80gb")
MISTRAL = get_model("mistral-7b")
HANDBOOK = Path(__file__).resolve().parents[1] / "datasets" / "public" / "alignment_handbook" / "runs.parquet"


def _handbook_dpo(*, eager: bool, mb: int = 8, ga: int = 2, seq: int = 1024, recompute: str = "full") -> pl.DataFrame:
    w = Workload(objective="dpo", seq_len=seq, global_batch=8 * mb * ga)
    p = Plan(framework="deepspeed", dp=8, zero=3, micro_batch=mb, grad_accum=ga, recompute=recompute,
             eager_attention=eager)
    return describe(plans_frame(MISTRAL, Cluster(H100, 8, 1), w, [p]))


def test_eager_attention_is_a_checked_plan_field_kept_out_of_old_plans_dicts():
    with pytest.raises(PerfPredictError, match="eager_attention must be true or false"):
        Plan(eager_attention="yes")
    assert "eager_attention" not in Plan().to_dict()
    p = Plan(eager_attention=True)
    assert Plan.from_dict(p.to_dict()) == p and "eager-attention" in p.label()


def test_handbook_dpo_scores_are_charged_as_counted_from_the_code():
    q = kernel_queries(_handbook_dpo(eager=True))
    scores = q.filter((c("op") == "add") & (c("numel") == 16 * 32 * 1024 * 1024))
    assert scores.height == 1
    want = 32 * 2 * (3 * EAGER_ATTENTION.fwd_per_score + EAGER_ATTENTION.bwd_per_score) / 3.0
    assert scores["count"][0] == pytest.approx(want)
    assert scores["rf"][0] == pytest.approx(32 * 2 * EAGER_ATTENTION.fwd_per_score / 3.0)  # the live reference's
    # The score GEMMs run the whole square: twice the causal attention kernel's work.
    flash = kernel_queries(_handbook_dpo(eager=False)).filter(c("op") == "attention")
    eager = q.filter(c("op") == "attention")
    assert eager["count"].sum() == pytest.approx(2.0 * flash["count"].sum())
    assert kernel_queries(_handbook_dpo(eager=False)).filter(
        (c("op") == "add") & (c("numel") == 16 * 32 * 1024 * 1024)).height == 0


def test_eager_attention_costs_time_growing_with_the_sequence_at_equal_tokens():
    b = default_bundle()
    extra = []
    for seq, mb in ((1024, 8), (2048, 4)):  # the same tokens per micro-batch
        t_eager = b.compose(_handbook_dpo(eager=True, seq=seq, mb=mb))
        t_flash = b.compose(_handbook_dpo(eager=False, seq=seq, mb=mb))
        extra.append(t_eager["k_step_s"][0] - t_flash["k_step_s"][0])
        assert t_eager["k_hf_eager_s"][0] > t_flash["k_hf_eager_s"][0]
    assert 0.0 < extra[0] < extra[1]  # scores per token grow with s: about twice the extra at twice s
    assert 1.6 < extra[1] / extra[0] < 2.4, extra


def test_eager_attention_keeps_the_scores_of_the_recomputed_layer():
    """Full recompute re-materialises one layer: its fp32 softmax output and 16-bit cast, 6 B per score element,
    16 x 32 x 1024^2 x 6 B = 3.0 GiB more than with a fused kernel (which keeps none)."""
    d_eager, d_flash = _handbook_dpo(eager=True), _handbook_dpo(eager=False)
    grew = (d_eager["d_act_first"][0] - d_flash["d_act_first"][0]) / 2**30
    assert grew == pytest.approx(16 * 32 * 1024 * 1024 * 6 / 2**30, rel=1e-9)


def test_the_handbook_dpo_row_carries_eager_attention_and_its_other_rows_do_not():
    runs = pl.read_parquet(HANDBOOK)
    eager = dict(zip(runs["transcribed_row"], runs["p_eager_attention"].fill_null(False), strict=True))
    assert eager == {"zephyr-7b-dpo-full": True, "zephyr-7b-sft-full": False, "mistral-7b-grok": False,
                     "zephyr-orpo-141b-A35b": False}
