"""transformers' reentrant gradient checkpointing under FSDP1 (plan reentrant_checkpoint, issue 19 item 3): each
FULL_SHARD block is gathered a third time per micro-batch, for its recompute (core.frameworks
REENTRANT_REGATHER_FRAMEWORKS, torch/distributed/fsdp/_runtime_utils.py). The alignment handbook's ORPO run of
Mixtral-8x22B on 4 nodes of 8 H100 (recipes/zephyr-141b-A35b/orpo/config_full.yaml at 70769f9: FSDP FULL_SHARD,
`gradient_checkpointing_kwargs: {use_reentrant: true}`) carries it. And the learned step-time correction's source
gate (train.fit.source_gate)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from perfpredict.core import Cluster, PerfPredictError, Plan, Workload, get_gpu, get_model
from perfpredict.features.descriptors import describe
from perfpredict.features.frame import plans_frame
from perfpredict.models.bundle import default_bundle
from perfpredict.models.compose import kernel_queries

c = pl.col
H100 = get_gpu("h100-sxm-80gb")
LLAMA8 = get_model("llama-3.1-8b")
HANDBOOK = Path(__file__).resolve().parents[1] / "datasets" / "public" / "alignment_handbook" / "runs.parquet"


def _frame(framework: str, *, reentrant: bool, recompute: str = "full", nodes: int = 4, mb: int = 1,
           zero: int = 3) -> pl.DataFrame:
    gpus = 8 * nodes
    w = Workload(objective="sft", seq_len=2048, global_batch=gpus * 4)
    p = Plan(framework=framework, dp=gpus, zero=zero, micro_batch=mb, grad_accum=4 // mb, recompute=recompute,
             reentrant_checkpoint=reentrant)
    return describe(plans_frame(LLAMA8, Cluster(H100, 8, nodes), w, [p]))


def _gathers(df: pl.DataFrame) -> float:
    q = kernel_queries(df).filter((c("part") == "zero3") & (c("op") == "all_gather"))
    return float(q["count"].sum())


def test_reentrant_checkpoint_is_a_checked_plan_field_kept_out_of_old_plans_dicts():
    with pytest.raises(PerfPredictError, match="reentrant_checkpoint must be true or false"):
        Plan(framework="fsdp", reentrant_checkpoint="yes")
    assert "reentrant_checkpoint" not in Plan(framework="fsdp").to_dict()
    assert "reentrant-checkpoint" in Plan(framework="fsdp", reentrant_checkpoint=True).label()


@pytest.mark.parametrize("framework", ["fsdp", "trl+fsdp"])
def test_fsdp1_gathers_each_block_once_more_for_a_reentrant_recompute(framework):
    """Per layer and micro-batch: forward, the recompute's forward, the backward (3) instead of 2."""
    plain, reentrant = _gathers(_frame(framework, reentrant=False)), _gathers(_frame(framework, reentrant=True))
    assert reentrant == pytest.approx(plain * 3.0 / 2.0)


@pytest.mark.parametrize("framework,recompute", [("deepspeed", "full"), ("fsdp2", "full"), ("fsdp", "none")])
def test_no_extra_gather_where_the_code_keeps_or_skips_it(framework, recompute):
    """DeepSpeed keeps the recompute's gather for the backward (stage3_max_reuse_distance); FSDP2 is not claimed;
    without recompute there is nothing to recompute."""
    assert _gathers(_frame(framework, reentrant=True, recompute=recompute)) == _gathers(
        _frame(framework, reentrant=False, recompute=recompute))


def test_reentrant_recompute_costs_time_and_a_slower_link_costs_more():
    b = default_bundle()
    base, rc = _frame("fsdp", reentrant=False), _frame("fsdp", reentrant=True)
    t = [float(b.compose(f, canonical=False)["k_step_s"][0]) for f in (base, rc)]
    assert t[1] > t[0]
    slow = [float(b.compose(f.with_columns(c_inter_bw_gb_per_s=c("c_inter_bw_gb_per_s") / k),
                            canonical=False)["k_step_s"][0]) for k in (1.0, 2.0, 4.0) for f in (rc,)]
    assert slow[0] < slow[1] < slow[2]
    # The extra gathers hurt more where the link is slower.
    base_slow = float(b.compose(base.with_columns(c_inter_bw_gb_per_s=c("c_inter_bw_gb_per_s") / 4.0),
                                canonical=False)["k_step_s"][0])
    assert slow[2] - base_slow > t[1] - t[0] > 0.0


def test_the_handbook_orpo_row_carries_it_and_no_other_row_does():
    runs = pl.read_parquet(HANDBOOK)
    flagged = runs.filter(c("p_reentrant_checkpoint").fill_null(False))["upstream_ref"].to_list()
    assert len(flagged) == 1 and "zephyr-orpo-141b" in flagged[0]


def test_source_gate_drops_a_domain_whose_correction_is_worse_on_a_source_left_out():
    """Two sources share a domain; one's ratio (measured 1.5x the composition) is carried to the other (measured
    = composition) when that one is left out: worse than the composition there, so the domain is gated; a domain
    of one source has no such evidence and keeps its correction."""
    from perfpredict.train.data import load_runs, time_rows
    from perfpredict.train.fit import fit_corrections

    runs = load_runs(Path(__file__).resolve().parents[1] / "datasets")
    rows = time_rows(default_bundle().compose(runs.filter(c("source") == "vtrain").head(120)))
    rows = rows.with_columns(k_step_s=c("step_time_s"))  # the composition exact on vtrain's rows
    a = rows.head(60).with_columns(source=pl.lit("a"), step_time_s=c("step_time_s") * 1.5)
    b = rows.tail(60).with_columns(source=pl.lit("b"))
    t, _ = fit_corrections(pl.concat([a, b]))
    assert t.gated_ == ["3d:a100-sxm-80gb:single-node"] and "3d:a100-sxm-80gb:single-node" not in t.domains_
    alone, _ = fit_corrections(a)
    assert alone.gated_ == [] and alone.domains_ == ["3d:a100-sxm-80gb:single-node"]
    assert np.allclose(t.weight(b), 0.0)


def test_the_zero_family_gets_no_step_time_correction_on_gpus():
    """Every time the ZeRO family's GPU correction reached another source's runs it was worse than the composition
    (train.fit.GPU_UNCORRECTED_FAMILIES): gated on GPUs, kept on the CPU hosts, other families untouched."""
    from perfpredict.train.fit import gpu_family_gated

    domains = ["3d:a100-sxm-80gb:single-node", "zero:a100-sxm-80gb:single-node", "zero:h100-sxm-80gb:multi-node",
               "zero:cpu:single-node", "zero:cpu-epyc-avx2:single-node"]
    assert gpu_family_gated(domains) == ["zero:a100-sxm-80gb:single-node", "zero:h100-sxm-80gb:multi-node"]
