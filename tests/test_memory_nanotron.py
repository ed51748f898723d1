"""nanotron's own memory terms (core.frameworks NANOTRON_CE_LOGIT_BYTES, nanotron_stage_layers; read by
features.memory): bytes per logit at its loss, and the cost-balanced pipeline split that front-loads the first stage.
Cited lines: huggingface/nanotron at 9055c664 (2025-01, the build the Ultra-Scale playbook ran)."""

from __future__ import annotations

import polars as pl
import pytest

from perfpredict.core.catalog import get_gpu, get_model
from perfpredict.core.frameworks import NANOTRON_CE_LOGIT_BYTES, RUNTIMES, nanotron_stage_layers
from perfpredict.core.hardware import Cluster
from perfpredict.core.plan import Plan
from perfpredict.core.workload import Workload
from perfpredict.features.descriptors import describe
from perfpredict.features.frame import plans_frame

PRETRAIN = Workload(objective="pretrain", seq_len=1024, global_batch=64)


def _row(framework: str, **plan) -> dict:
    model = get_model("llama-3.2-1b")
    df = describe(plans_frame(model, Cluster(get_gpu("h100-sxm-80gb"), 8, 1), PRETRAIN,
                              [Plan(framework=framework, **plan)]))
    assert df.height == 1
    return df.row(0, named=True)


def test_playbook_1b_split_front_loads_the_first_stage():
    # The playbook's 1B (16 layers, hidden 2048, 32 x 64 heads, ffn 8192, vocab 131072): a layer costs
    # 4*2048*2048 + 3*8192*2048 = 67.1e6, the head 131072*2048 = 268.4e6 = 4 layers: 20 layers' cost, 2.5 a stage.
    # models/base.py:228-233 places a block, then advances once the cumulative cost passes total*(rank+1)/pp:
    # rank 0 takes layers 1-3 (3 > 2.5), rank 1 4-6 (6 > 5), rank 2 7-8 (8 > 7.5), rank 3 9-11, rank 4 12-13,
    # rank 5 14-16, rank 6 the final norm and the head (20 > 17.5), rank 7 the fp32 cast and the loss.
    split = nanotron_stage_layers(16, 8, hidden=2048, attn_width=2048, ffn=8192, vocab=131072)
    assert split == (3, 3, 2, 3, 2, 3, 0, 0)
    assert nanotron_stage_layers(16, 1, hidden=2048, attn_width=2048, ffn=8192, vocab=131072) == (16,)
    # 8B (32 layers, 4096, ffn 14336): the head is 2.2 layers' cost; over 32 stages the first holds 2, not 1.
    split32 = nanotron_stage_layers(32, 32, hidden=4096, attn_width=4096, ffn=14336, vocab=131072)
    assert sum(split32) == 32 and split32[0] == 2


def test_nanotron_plan_without_a_split_takes_its_own():
    nano = _row("nanotron", tp=1, pp=8, dp=1, micro_batch=1, grad_accum=8)
    want = nanotron_stage_layers(16, 8, hidden=2048, attn_width=2048, ffn=8192, vocab=128256)
    assert want[0] == 3  # llama-3.2-1b's head (128256 x 2048) is 3.9 layers' cost: the same front-loading
    assert nano["d_layers_first"] == want[0] and nano["d_layers_max"] == max(want)
    assert nano["d_layers_last"] == want[-1]
    # 1F1B keeps pp micro-batches on the first stage: 8 x 3 layers, not 8 x 2.
    assert nano["d_act_first"] == pytest.approx(nano["d_act_per_layer"] * 3 * 8)
    mega = _row("megatron", tp=1, pp=8, dp=1, micro_batch=1, grad_accum=8)
    assert mega["d_layers_first"] == 2 and mega["d_layers_max"] == 2  # Megatron splits evenly: unchanged


def test_nanotron_logits_bytes_per_element():
    # tokens x vocab/tp logits: nanotron holds the fp32 cast (llama.py:874-876, 909) and _ShardedCrossEntropy's
    # max-subtracted fp32 copy (tensor_parallel/functional.py:43), 8 B; Megatron's fused loss 6 B.
    tokens, vocab, tp = 1024 * 1, 128256, 2
    nano = _row("nanotron", tp=tp, pp=1, dp=4, micro_batch=1, grad_accum=16, sequence_parallel=True)
    mega = _row("megatron", tp=tp, pp=1, dp=4, micro_batch=1, grad_accum=16, sequence_parallel=True)
    assert NANOTRON_CE_LOGIT_BYTES == 8.0 and RUNTIMES["megatron"].vocab_ce_logit_bytes == 6.0
    assert nano["d_logits_bytes"] == pytest.approx(tokens * vocab / tp * 8.0)
    assert mega["d_logits_bytes"] == pytest.approx(tokens * vocab / tp * 6.0)
    assert nano["d_act_first"] == pytest.approx(mega["d_act_first"])  # the layers' activations are shared


def test_playbook_first_stage_activations_follow_the_split():
    # The playbook's 1B at pp 8 (datasets/public/ultrascale_playbook): the measured peak grows with the micro-batch
    # 1.5x faster than layers/pp x pp in-flight micro-batches says; the split holds 3 layers there, not 2.
    from perfpredict.train.data import load_runs

    runs = load_runs("datasets").filter((pl.col("source") == "ultrascale_playbook") & (pl.col("p_pp") == 8)
                                        & (pl.col("m_name") == "playbook-llama-1b"))
    assert runs.height > 0
    assert (runs["d_layers_first"] == 3.0).all()
