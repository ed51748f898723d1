"""Framework trl: capability table rows, plan space, TRL memory descriptors, TRL rows as a data source,
and the emitted trainer configs loaded by TRL 1.16 itself."""

import json
import warnings

import numpy as np
import polars as pl
import pytest

from perfpredict.core.catalog import get_gpu, get_model
from perfpredict.core.frameworks import CAPABILITIES, DEFAULT_RANKED, RANKABLE, why_not
from perfpredict.core.hardware import Cluster
from perfpredict.core.model import ModelSpec
from perfpredict.core.plan import Plan
from perfpredict.core.scenario import flat_row
from perfpredict.core.workload import Workload
from perfpredict.features.descriptors import describe
from perfpredict.features.plans import PlanSpace, Rejections, enumerate_plans
from perfpredict.features.trl import TOKEN_TILE, VOCAB_TILE
from perfpredict.predictor.emit import emit
from perfpredict.predictor.emit.common import fit
from perfpredict.train.data import trl_rows
from perfpredict.train.evaluate import folds

CPU = Cluster(gpu=get_gpu("cpu"), gpus_per_node=2, nodes=1)
H100 = Cluster(gpu=get_gpu("h100-sxm-80gb"), gpus_per_node=8, nodes=1)
# A collect-trl-sized shape (h 256, 4 layers, vocab 8k): small enough that the head term is checkable by hand.
SMALL = ModelSpec(name="trl-test-s", layers=4, hidden=256, heads=4, kv_heads=4, ffn=688, vocab=8192)


def _row(objective, reference, *, framework="trl", dp=1, zero=0, mb=2, ga=1, seq=256, model=SMALL, cluster=None,
         precision="fp32", recompute="none"):
    cluster = cluster or Cluster(gpu=get_gpu("cpu"), gpus_per_node=dp, nodes=1)
    w = Workload(objective=objective, seq_len=seq, global_batch=mb * ga * dp, precision=precision,
                 reference=reference)
    p = Plan(dp=dp, zero=zero, micro_batch=mb, grad_accum=ga, framework=framework, recompute=recompute)
    return flat_row(model, cluster, w, p)


def _describe(rows):
    return describe(pl.DataFrame(rows))


def test_trl_frameworks_rankable_only_when_asked():
    for name in ("trl", "trl+deepspeed", "trl+fsdp"):
        assert name in RANKABLE and CAPABILITIES[name].rankable
        assert name not in DEFAULT_RANKED
    assert PlanSpace(frameworks=("trl",)).frameworks == ("trl", "trl+deepspeed", "trl+fsdp")
    assert "trl" not in PlanSpace().frameworks


def test_rank_space_trl_plans_are_runnable_and_emittable():
    m, w = get_model("llama-3.2-1b"), Workload(objective="dpo", seq_len=1024, global_batch=32)
    plans = list(enumerate_plans(m, H100, w, PlanSpace(frameworks=("trl",)), Rejections()))
    assert plans and {p.framework for p in plans} == {"trl", "trl+deepspeed", "trl+fsdp"}
    for p in plans:
        assert p.tp == p.pp == p.cp == 1
        assert why_not(p, m) is None
        assert fit("trl", p, w, m) is None, p.label()
    assert {p.zero for p in plans if p.framework == "trl"} == {0}
    assert {p.zero for p in plans if p.framework == "trl+fsdp"} <= {2, 3}
    # tp/pp are not TRL's: the table refuses them with a reason.
    assert "no tensor parallelism" in why_not(Plan(tp=2, dp=4, framework="trl+deepspeed"), m)


def test_fused_head_bytes_follow_trl_chunked_logprob():
    """DPO's head on CPU (trl/kernels/chunked_logprob.py:300-440, no Triton): fp32 grad_hidden [N, h] and grad_weight
    [V, h], the tile buffer [min(N, 4096), 32768] (full chunk width even at V = 8192, :413) and 29 bytes of fold
    temporaries per [min(N, 4096), min(V, 32768)] tile element (profiler replay, features.trl). N = micro-batch x 2
    (chosen + rejected) x padded length. Exact by construction (tolerance 1e-9)."""
    d = _describe([_row("dpo", "precomputed")]).row(0, named=True)
    n, h, v = 2 * 2 * 256, 256, 8192
    rows = min(n, TOKEN_TILE)
    expect = 4 * n * h + 4 * v * h + rows * VOCAB_TILE * 4 + rows * min(v, VOCAB_TILE) * 29
    assert d["d_logits_bytes"] == pytest.approx(expect, rel=1e-9)
    assert d["d_ref_weight_bytes"] == 0.0  # precompute without ref_model: DPOTrainer builds none (:908-914)


def test_live_reference_is_a_full_replica_unless_sharded():
    live = _describe([_row("dpo", "live")]).row(0, named=True)
    assert live["d_ref_weight_bytes"] == pytest.approx(live["d_params_rank"] * 4.0)  # fp32 policy -> fp32 reference
    fsdp = _describe([_row("dpo", "live", framework="trl+fsdp", dp=2, zero=3)]).row(0, named=True)
    assert fsdp["d_ref_weight_bytes"] == pytest.approx(fsdp["d_params_rank"] * 4.0 / 2)


def test_memory_relations():
    """Physics: a live reference costs memory, precomputing saves it; SimPO's full logits grow with the vocabulary,
    the fused DPO head far less; checkpointing never adds memory; KTO runs half DPO's sequences with gradient."""
    rows = [_row("dpo", "live"), _row("dpo", "precomputed"), _row("simpo", "none"), _row("orpo", "none"),
            _row("kto", "live"), _row("dpo", "live", recompute="full")]
    big_v = ModelSpec(name="trl-test-v", layers=4, hidden=256, heads=4, kv_heads=4, ffn=688, vocab=65536)
    rows += [_row("simpo", "none", model=big_v), _row("dpo", "precomputed", model=big_v)]
    m = _describe(rows)["d_mem_gib"].to_numpy()
    assert m[0] > m[1]
    assert m[3] > m[2]  # ORPO's chosen NLL on top of the same logits
    assert m[5] <= m[0]
    assert m[4] < m[0]
    assert m[6] / m[2] > m[7] / m[1]


def test_kto_and_fused_head_passes_in_composition_descriptors():
    d = _describe([_row("dpo", "live"), _row("kto", "live"), _row("simpo", "none"),
                   {**_row("dpo", "live"), "p_framework": "deepspeed"}])
    # DPO: policy + reference forward + the backward's tile recompute; KTO: + the KL batch through both models.
    assert d["d_head_fwd_passes"].to_list() == [3.0, 5.0, 1.0, 2.0]
    assert d["d_extra_fwd_passes"].to_list() == [0.0, 2.0, 0.0, 0.0]


def _trl_frame():
    rows = []
    for shape, h in (("s1", 128), ("s2", 256)):
        m = ModelSpec(name=shape, layers=2, hidden=h, heads=4, kv_heads=4, ffn=2 * h, vocab=4096)
        for backend in ("single", "ddp", "fsdp"):
            dp = 1 if backend == "single" else 2
            r = _row("dpo", "live", model=m, dp=dp, zero=3 if backend == "fsdp" else 0, framework="trl")
            rows.append({**r, "source": "ours-cpu", "backend": backend, "padded_len_mean": 200.0,
                         "ddp_bucket_bytes": (1 << 30) if backend == "ddp" else 0, "peak_memory_gib": 1.0,
                         "outcome": "ok", "step_time_s": 1.0, "model_shape": shape})
    return pl.DataFrame(rows)


def test_trl_rows_normalised_as_a_source():
    df = trl_rows(_trl_frame())
    assert set(df["source"]) == {"ours-cpu-trl"}
    assert df.filter(pl.col("backend") == "fsdp")["p_framework"].unique().to_list() == ["trl+fsdp"]
    assert df.filter(pl.col("backend") != "fsdp")["p_framework"].unique().to_list() == ["trl"]
    assert df["w_seq_len"].unique().to_list() == [200] and df["w_seq_len_nominal"].unique().to_list() == [256]
    ddp = df.filter(pl.col("backend") == "ddp")
    assert ddp["peak_memory_gib"].to_list() == [2.0, 2.0] and ddp["peak_memory_live_gib"].to_list() == [1.0, 1.0]


def test_trl_shape_folds_hold_out_one_shape_of_trl_rows():
    df = describe(trl_rows(_trl_frame())).with_columns(
        model_group=pl.concat_str([pl.col("source"), pl.col("m_name")], separator=":"))
    other = df.head(1).with_columns(p_framework=pl.lit("fsdp"), model_group=pl.lit("ours-cpu:x"))
    df = pl.concat([df, other], how="diagonal_relaxed")
    got = list(folds(df, "trl-shape"))
    assert [g for g, _ in got] == ["ours-cpu-trl:s1", "ours-cpu-trl:s2"]
    for g, mask in got:
        assert mask.sum() == 3 and not mask[-1]
        assert set(np.asarray(df["model_group"])[mask]) == {g}


# --- the emitted trainer configs load in TRL ------------------------------------------------------------------------

CONFIGS = {"trl_dpo_args.json": ("trl", "DPOConfig"), "trl_kto_args.json": ("trl", "KTOConfig"),
           "trl_cpo_args.json": ("trl.experimental.cpo", "CPOConfig"),
           "trl_orpo_args.json": ("trl.experimental.orpo", "ORPOConfig")}


@pytest.mark.parametrize("objective,reference,framework,zero,recompute", [
    ("dpo", "live", "trl", 0, "full"), ("dpo", "precomputed", "trl+deepspeed", 3, "none"),
    ("ipo", "live", "trl+fsdp", 3, "full"), ("simpo", "none", "trl", 0, "none"), ("orpo", "none", "trl", 0, "full"),
    ("kto", "precomputed", "trl+deepspeed", 2, "none")])
def test_emitted_trainer_config_loads_in_trl(tmp_path, objective, reference, framework, zero, recompute):
    pytest.importorskip("trl")
    import importlib

    from transformers import HfArgumentParser

    w = Workload(objective=objective, seq_len=1024, global_batch=16, reference=reference)
    p = Plan(dp=2, zero=zero, micro_batch=2, grad_accum=4, framework=framework, recompute=recompute)
    cluster = Cluster(gpu=get_gpu("h100-sxm-80gb"), gpus_per_node=2, nodes=1)
    files = emit("trl", model=get_model("llama-3.2-1b"), cluster=cluster, workload=w, plan=p)
    name = next(f for f in files if f in CONFIGS)
    module, cls = CONFIGS[name]
    args = json.loads(files[name])
    args["output_dir"] = str(tmp_path / "out")
    # The config is for GPUs (bf16 True); transformers checks bf16 support at parse time, so on this CPU the test
    # adds use_cpu, the one key it changes.
    args["use_cpu"] = True
    path = tmp_path / name
    path.write_text(json.dumps(args))
    config_cls = getattr(importlib.import_module(module), cls)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (cfg,) = HfArgumentParser(config_cls).parse_json_file(str(path))  # unknown keys raise here
    assert cfg.per_device_train_batch_size == 2 and cfg.gradient_accumulation_steps == 4
    assert cfg.max_length == 1024
    assert cfg.gradient_checkpointing == (recompute == "full" and framework != "trl+fsdp")
    if objective in ("dpo", "ipo", "kto"):
        assert cfg.precompute_ref_log_probs == (reference == "precomputed")
    if objective in ("dpo", "ipo"):
        assert list(cfg.loss_type) == ["sigmoid" if objective == "dpo" else "ipo"]
    expected = {"trl": {"accelerate_config.yaml"}, "trl+deepspeed": {"accelerate_config.yaml", "ds_config.json"},
                "trl+fsdp": {"accelerate_fsdp.yaml"}}[framework]
    assert expected <= set(files)


def test_emit_trl_ddp_accelerate_config():
    yaml = pytest.importorskip("yaml")
    w = Workload(objective="dpo", seq_len=512, global_batch=16)
    p = Plan(dp=8, micro_batch=2, grad_accum=1, framework="trl")
    files = emit("trl", model=get_model("llama-3.2-1b"), cluster=H100, workload=w, plan=p)
    cfg = yaml.safe_load(files["accelerate_config.yaml"])
    assert cfg["distributed_type"] == "MULTI_GPU" and cfg["num_processes"] == 8 and cfg["mixed_precision"] == "bf16"
    # deepspeed/fsdp targets refuse plain-DDP TRL plans, and the trl target refuses non-TRL plans.
    assert fit("deepspeed", p, w, get_model("llama-3.2-1b")) is not None
    assert fit("trl", Plan(dp=8, micro_batch=2, framework="deepspeed"), w, get_model("llama-3.2-1b")) is not None


def test_trl_calibration_defaults_without_trl_steps_and_only_moves_trl_rows():
    """Fewer than 10 measured TRL steps: the defaults; the fitted efficiencies never touch a non-TRL or GPU row."""
    from perfpredict.models.calibration import TrlCalibration
    from perfpredict.models.compose import TRL_CALIBRATION, compose
    from perfpredict.predictor.predict import load_predictor

    b = load_predictor()
    d = _describe([_row("dpo", "live"), {**_row("dpo", "live"), "p_framework": "fsdp"},
                   _row("dpo", "live", cluster=Cluster(gpu=get_gpu("h100-sxm-80gb"), gpus_per_node=1, nodes=1),
                        precision="bf16")])
    est = TrlCalibration(b.kernels, launch_floor=b.launch_floor_s).fit(d, np.ones(d.height))
    assert est.calibration_ == TRL_CALIBRATION and est.n_rows_ == 1
    cal = {**TRL_CALIBRATION, **(b.trl_calibration or {})}  # the shipped bundle's fitted calibration over the defaults
    base = compose(d, b.kernels, launch_floor=b.launch_floor_s, trl_calibration=cal, canonical=False)["k_step_s"]
    out = compose(d, b.kernels, launch_floor=b.launch_floor_s,
                  trl_calibration={**cal, "gemm_scale": cal["gemm_scale"] * 2.0}, canonical=False)
    base, moved = base.to_numpy(), out["k_step_s"].to_numpy()
    # Doubling the GEMM efficiency scale adds the TRL row's scaled GEMM time once more, and nothing elsewhere.
    gemm = out["k_gemm_s"].to_numpy()
    assert moved[0] == pytest.approx(base[0] + cal["gemm_scale"] * gemm[0])
    assert moved[0] > base[0] and moved[1] == base[1] and moved[2] == base[2]


def test_deepspeed_fp32_states_follow_zero_partitions():
    """trl+deepspeed in fp32 (deepspeed 0.19.8 runtime/zero): ZeRO-1/2 keep the fp32 weights (4), an fp32 master
    partition cloned from them (stage_1_and_2.py:560-561, 4/d) and Adam's m and v on it (8/d); ZeRO-3 shards the
    weights and keeps a persistent gradient partition (stage3.py:791, 4/d); ZeRO-0 is the torch optimizer on the
    parameters (no master). Measured by collect trl on this CPU: 16 B/param at step begin at ZeRO-1/2 world 1,
    14 = 4 + 12/2 at world 2 with a live reference's 4, 20 at ZeRO-3 world 1. Exact (tolerance 1e-12)."""
    rows = [_row("simpo", "none", framework="trl+deepspeed", zero=z, dp=d) for z in (0, 1, 2, 3) for d in (1, 2)]
    got = {(r["p_zero"], r["p_dp"]): r for r in _describe(rows).iter_rows(named=True)}
    for (z, d), r in got.items():
        master_and_adam = 8.0 if z == 0 else 12.0 / d
        assert r["d_optim_bpp"] == pytest.approx(master_and_adam, rel=1e-12)
        assert r["d_weight_bpp"] == pytest.approx(4.0 / d if z == 3 else 4.0, rel=1e-12)
    assert got[(3, 2)]["d_grad_bpp"] == pytest.approx(2.0, rel=1e-12)  # the persistent fp32 gradient partition
    # ZeRO-3 over one rank gathers nothing (partition_parameters.py:1559-1560); over two, with the 1e9 reuse distance
    # of the emitted config, a model this small stays gathered from its forward to its backward
    # (partitioned_param_coordinator.py:653-662): all its fp32 weights.
    assert got[(3, 1)]["d_gathered_bytes"] == 0.0
    assert got[(3, 2)]["d_gathered_bytes"] == pytest.approx(4.0 * got[(3, 2)]["d_params_rank"], rel=1e-12)


def test_deepspeed_step_gradient_buffers_when_activations_are_small():
    """ZeRO-0: autograd's .grad (4) plus the one all-reduce bucket they are flattened into at the boundary (engine.py
    :3095, :3796); ZeRO-1/2: grads_in_partition (4/d) plus the step's flattened copy (4/d) (stage_1_and_2.py
    :2189-2194, :3114-3117). Measured: +8.0 B/param at world 1 with small activations. Tolerance 1e-9."""
    tiny = dict(mb=1, seq=16, recompute="full")  # activations and head far below 8 B/param
    for z in (0, 1, 2):
        for d in (1, 2):
            r = _describe([_row("simpo", "none", framework="trl+deepspeed", zero=z, dp=d, **tiny)]).row(0, named=True)
            act_head = r["d_act_first"] + r["d_head_bwd_bytes"]
            extra = r["d_grad_bpp"] * r["d_params_rank"] + act_head
            grads = (8.0 if z == 0 else 8.0 / d) * r["d_params_rank"]
            # ZeRO-1 keeps the other partitions' .grad through the backward (stage_1_and_2.py:2270-2272): 4 per
            # parameter in all with its own partition's buffer, while the last activations are still alive.
            layers = 4.0 * r["d_params_rank"] + r["d_act_first"] if z == 1 else 0.0
            assert extra == pytest.approx(max(grads, act_head, layers), rel=1e-9) and act_head < grads
    # More memory per rank never comes from more ranks (ZeRO shards only ever shrink with dp).
    big = [_row("dpo", "live", framework="trl+deepspeed", zero=z, dp=d, mb=4) for z in (1, 2, 3) for d in (1, 2)]
    mem = {(r["p_zero"], r["p_dp"]): r["d_mem_gib"] for r in _describe(big).iter_rows(named=True)}
    assert all(mem[(z, 2)] <= mem[(z, 1)] for z in (1, 2, 3))


def test_deepspeed_host_terms_move_only_trl_deepspeed_cpu_rows():
    """The fitted DeepSpeed terms (a per-step engine cost, ZeRO-3's per-tensor hooks per pass) add exactly their
    units to TRL DeepSpeed plans on CPU, and nothing to a ZeRO-0..2 plan's hook term or to any other plan."""
    from perfpredict.models.compose import TRL_CALIBRATION, compose
    from perfpredict.predictor.predict import load_predictor

    b = load_predictor()
    d = _describe([_row("dpo", "live", framework="trl+deepspeed", zero=3),
                   _row("dpo", "live", framework="trl+deepspeed", zero=2), _row("dpo", "live")])
    cal = {**TRL_CALIBRATION, **(b.trl_calibration or {})}

    def step(**terms):
        return compose(d, b.kernels, launch_floor=b.launch_floor_s, trl_calibration={**cal, **terms},
                       canonical=False)["k_step_s"].to_numpy()

    base = step(zero3_hook_s=0.0, deepspeed_step_s=0.0)
    moved = step(zero3_hook_s=1e-3, deepspeed_step_s=0.1)
    row = d.row(0, named=True)
    tensors = row["m_layers"] * 9 + 2 + (0 if row["m_tied"] else 1)
    assert moved[0] - base[0] == pytest.approx(0.1 + 1e-3 * tensors * row["d_layer_passes"] * row["p_grad_accum"])
    assert moved[1] - base[1] == pytest.approx(0.1)
    assert moved[2] == base[2]
